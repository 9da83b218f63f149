//! The wake (see [`Sql::wake`]) made ready in a waiter's session before it
//! holds, so that its release, on the handoff's path, has the server neither
//! parse nor plan it: about three quarters of that transaction's server time
//! otherwise (BENCHMARKS.md: "PostgreSQL: one run's cost, part by part, and the line").
//!
//! It is an SQL `PREPARE` under a name made from its text, planned once for
//! any parameters (a generic plan) by an `EXPLAIN EXECUTE`, which runs
//! nothing. Behind a transaction-pooling pgbouncer a later transaction may
//! reach a server session without it: the release then fails and is rolled
//! back before it commits anything, and is made again with the plain
//! statement. A server session that has one under the same name (prepared by
//! another lockrun through the same pooler) has the same text, so it does the same.

use tokio_postgres::Client;
use tokio_postgres::types::Type;

use super::sql::{CHANNEL_PREFIX, Sql};
use crate::name::fnv1a_128;

/// The first server version that keeps one plan for any parameters on request (`plan_cache_mode`).
pub const SINCE_MAJOR: u32 = 12;

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

    /// Runs it for `name`, telling the next two places when `moved`: the
    /// statements that go before the name's lock, then the one that replaces
    /// the plain wake. `EXECUTE` takes no bound parameters, so the name is
    /// written in as a literal.
    pub fn execute(&self, name: &str, moved: bool) -> (&'static str, String) {
        let execute = format!(
            "EXECUTE {}({}, {}, {moved})",
            self.name,
            literal(name),
            literal(CHANNEL_PREFIX)
        );
        (GENERIC_PLAN, execute)
    }
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

    #[test]
    fn a_name_is_written_in_so_that_it_reads_back_as_itself() {
        assert_eq!(literal("plain"), "E'plain'");
        assert_eq!(literal(r"a'b\c"), r"E'a''b\\c'");
        assert_eq!(literal(r"\'); DROP"), r"E'\\''); DROP'");
    }
}
