//! The wake (see [`Sql::wake`]) made ready in a waiter's session before it
//! holds, so that its release, on the handoff's path, has the server neither
//! parse nor plan it: about three quarters of that transaction's server time
//! otherwise (BENCHMARKS.md: "PostgreSQL: one run's cost, part by part, and the line").
//!
//! It is an SQL `PREPARE` under a name made from its text, planned once for
//! any parameters (a generic plan) by an `EXPLAIN EXECUTE`, which runs
//! nothing. The release then goes as one message with its values written in
//! (`EXECUTE` takes no bound parameters anyway), which the server answers at
//! once rather than statement by statement. Behind a transaction-pooling
//! pgbouncer a later transaction may reach a server session without it: the
//! release then fails and is rolled back before it commits anything, and is
//! made again with the plain statement. A server session that has one under
//! the same name (prepared by another lockrun through the same pooler) has
//! the same text, so it does the same.

use tokio_postgres::Client;
use tokio_postgres::types::Type;

use super::sql::{CHANNEL_PREFIX, Sql};
use crate::name::fnv1a_128;

/// The first server version that keeps one plan for any parameters on request (`plan_cache_mode`).
pub const SINCE_MAJOR: u32 = 12;

/// Where the delete stands among the statements of [`PreparedWake::release`].
pub const DELETE_AT: usize = 2;

/// Plans a statement once for any parameters, for the transaction: the plan
/// `EXPLAIN EXECUTE` made is then the one used (PostgreSQL 12 and later).
const GENERIC_PLAN: &str = "SET LOCAL plan_cache_mode = force_generic_plan";

pub struct PreparedWake {
    /// `lockrun_wake_` and a hash of the statement's text (its schema in it).
    name: String,
    prepare: String,
    plan: String,
}

impl PreparedWake {
    pub fn new(sql: &Sql) -> Self {
        let name = format!("lockrun_wake_{:032x}", fnv1a_128(sql.wake.as_bytes()));
        Self {
            prepare: format!("PREPARE {name}(text, text, bool) AS {}", sql.wake),
            plan: format!("EXPLAIN EXECUTE {name}('', '', false)"),
            name,
        }
    }

    /// Prepares the wake and has it planned, for one transaction (see
    /// [`crate::backend::postgres::connect::Session::transact_written`]): a
    /// round trip. It fails where the server session has the wake prepared
    /// already (behind a pooler); [`PreparedWake::ready`] is for that one.
    pub fn readied(&self) -> [String; 3] {
        [
            GENERIC_PLAN.to_owned(),
            self.prepare.clone(),
            self.plan.clone(),
        ]
    }

    /// Prepares the wake, unless the server session has it already (behind
    /// a pooler), and has it planned: inside a transaction, which `client` is in.
    pub async fn ready(&self, client: &Client) -> Result<(), tokio_postgres::Error> {
        let prepared = client
            .query_typed(
                "SELECT FROM pg_prepared_statements WHERE name = $1",
                &[(&self.name, Type::TEXT)],
            )
            .await?;
        let prepare = if prepared.is_empty() {
            self.prepare.as_str()
        } else {
            ""
        };
        client
            .batch_execute(&format!("{GENERIC_PLAN}; {prepare}; {}", self.plan))
            .await
    }

    /// The release of `slot` of `name` by `token`, every value written in,
    /// for one message: the generic plan, the name's lock, the delete (at
    /// [`DELETE_AT`]) and this wake, which tells those it grants a slot.
    pub fn release(&self, sql: &Sql, name: &str, slot: u32, token: &str) -> [String; 4] {
        let name = literal(name);
        [
            GENERIC_PLAN.to_owned(),
            written(&sql.lock, &[&name]),
            written(&sql.release, &[&name, &slot.to_string(), &literal(token)]),
            format!(
                "EXECUTE {}({name}, {}, false)",
                self.name,
                literal(CHANNEL_PREFIX)
            ),
        ]
    }
}

/// `template` with each parameter `$n` replaced by `values[n - 1]` (one
/// with no value stays as it is). A `$` within quotes is text, not a
/// parameter: the schema's name, quoted, may hold one (`--prefix`). For
/// lockrun's own templates, whose quotes are plain: no `E''` escapes, no comments.
fn written(template: &str, values: &[&str]) -> String {
    let bytes = template.as_bytes();
    let mut text = String::with_capacity(template.len());
    // The quote we are within, if any, and where the text not yet copied starts.
    let mut quote = None;
    let mut copied = 0;
    let mut at = 0;
    while at < bytes.len() {
        let byte = bytes[at];
        at += 1;
        match quote {
            // A doubled quote within quotes ends them and begins them again.
            Some(open) if byte == open => quote = None,
            None if byte == b'"' || byte == b'\'' => quote = Some(byte),
            None if byte == b'$' => {
                let digits = bytes[at..]
                    .iter()
                    .take_while(|b| b.is_ascii_digit())
                    .count();
                let value = template[at..at + digits]
                    .parse::<usize>()
                    .ok()
                    .and_then(|n| values.get(n.checked_sub(1)?));
                if let Some(value) = value {
                    text.push_str(&template[copied..at - 1]);
                    text.push_str(value);
                    copied = at + digits;
                }
                at += digits;
            }
            // Within quotes, or outside them and no parameter.
            _ => {}
        }
    }
    text.push_str(&template[copied..]);
    text
}

/// `text` as an escape string literal, which reads the same whatever the
/// server's `standard_conforming_strings` and `backslash_quote` (lock names
/// hold no control characters).
fn literal(text: &str) -> String {
    format!("E'{}'", text.replace('\\', "\\\\").replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::postgres::schema::{SCHEMA_VERSION, Schema};

    #[test]
    fn a_name_is_written_in_so_that_it_reads_back_as_itself() {
        assert_eq!(literal("plain"), "E'plain'");
        assert_eq!(literal(r"a'b\c"), r"E'a''b\\c'");
        assert_eq!(literal(r"\'); DROP"), r"E'\\''); DROP'");
    }

    #[test]
    fn parameters_are_written_in_by_number_and_never_within_quotes() {
        assert_eq!(
            written(
                r#"a = $1 AND b = $2 OR $1 < $10 AND c = '$1''$2' AND "t$1""$2".d = $"#,
                &["x", "'y'"]
            ),
            r#"a = x AND b = 'y' OR x < $10 AND c = '$1''$2' AND "t$1""$2".d = $"#
        );
    }

    #[test]
    fn a_release_keeps_a_schema_named_like_a_parameter() {
        let schema = Schema::new(r#"lr$2"$1"#).unwrap();
        let sql = Sql::new(&schema, SCHEMA_VERSION);
        let release = PreparedWake::new(&sql).release(&sql, r#"n"'\"#, 7, "t");
        assert_eq!(
            release[1],
            r#"SELECT FROM "lr$2""$1".locks WHERE name = E'n"''\\' FOR UPDATE"#
        );
        assert_eq!(
            release[DELETE_AT],
            r#"DELETE FROM "lr$2""$1".holders WHERE name = E'n"''\\' AND slot = 7 AND token = E't' RETURNING slot"#
        );
    }
}
