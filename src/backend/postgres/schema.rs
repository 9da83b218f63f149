//! lockrun's schema in PostgreSQL (`--prefix`, default `lockrun`): created on
//! first use, versioned, and never touched when it is not lockrun's.
//!
//! The mark is a comment on the `holders` table, `lockrun schema version N`:
//! a table lockrun created is lockrun's to comment on, even in a schema a
//! database administrator made for it. A schema is used when it carries the
//! mark with this lockrun's version; created in when it is missing or empty;
//! refused untouched when it holds anything without the mark (someone else's
//! `holders` table, say), or a newer version.

use std::time::Duration;

use tokio_postgres::Client;
use tokio_postgres::types::Type;

use super::connect::Session;
use crate::backend::net::{Failure, Kind};
use crate::backend::newer_format;
use crate::error::Error;

/// Bumped when the tables change, so that a later lockrun can migrate them.
pub const SCHEMA_VERSION: i64 = 3;
/// The first version whose rows say their mode (docs/guide.md: "Shared locks").
pub const MODES_SINCE: i64 = 3;
/// What brings the tables of version N (from 1) up to version N + 1. An older
/// schema is brought up to date by a run; `status` and `release` read it as it is.
const UPGRADES: [&str; SCHEMA_VERSION as usize - 1] = [
    // Version 2: each row's -p.
    "ALTER TABLE {schema}.holders ADD COLUMN IF NOT EXISTS parallelism integer;
     ALTER TABLE {schema}.waiters ADD COLUMN IF NOT EXISTS parallelism integer;",
    // Version 3: each row's mode; rows of older lockruns held alone.
    "ALTER TABLE {schema}.holders ADD COLUMN IF NOT EXISTS mode text NOT NULL DEFAULT 'exclusive';
     ALTER TABLE {schema}.waiters ADD COLUMN IF NOT EXISTS mode text NOT NULL DEFAULT 'exclusive';",
];
/// Marks the tables as lockrun's, of this version, once brought up to date.
const MARK_THEM: &str = "COMMENT ON TABLE {schema}.holders IS '{marker}';";
/// The comment that marks the `holders` table (and so the schema) as lockrun's.
const MARK: &str = "lockrun schema version ";
/// The tables, with `{schema}` and `{marker}` to fill in.
const TABLES: &str = include_str!("schema.sql");
/// The tables a complete schema has.
const TABLE_NAMES: [&str; 3] = ["locks", "holders", "waiters"];
/// PostgreSQL's longest identifier, in bytes; a longer one would be cut short.
const MAX_IDENTIFIER: usize = 63;
/// The first key of the advisory lock that serializes creating the schema:
/// "LKRN", as in the SQLite database's application id.
const LOCK_CLASS: i32 = 0x4c4b_524e;

/// The schema's name, checked, and quoted for SQL text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schema {
    name: String,
    quoted: String,
}

impl Schema {
    /// The schema `--prefix` names: any 1 to 63 bytes but NUL.
    pub fn new(prefix: &str) -> Result<Self, Error> {
        if prefix.is_empty() || prefix.len() > MAX_IDENTIFIER || prefix.contains('\0') {
            return Err(Error::Usage(format!(
                "--prefix {prefix:?} cannot name a PostgreSQL schema: it must be 1 to {MAX_IDENTIFIER} bytes, without NUL"
            )));
        }
        Ok(Self {
            name: prefix.to_owned(),
            quoted: format!("\"{}\"", prefix.replace('"', "\"\"")),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `table` in this schema, quoted for SQL text.
    pub fn table(&self, table: &str) -> String {
        format!("{}.{table}", self.quoted)
    }
}

/// What the catalog says about the schema.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Found {
    /// No such schema, or one with nothing in it: lockrun may create its tables there.
    Room,
    /// lockrun's, of this version; `complete` when every table is there.
    Lockrun { version: i64, complete: bool },
    /// Something else's.
    Foreign,
}

impl Found {
    /// The version of lockrun's complete tables, older than this lockrun's.
    fn older(&self) -> Option<i64> {
        match *self {
            Self::Lockrun {
                version: version @ 1..SCHEMA_VERSION,
                complete: true,
            } => Some(version),
            _ => None,
        }
    }
}

/// What makes `found` a complete schema of this version, and the SQL for it:
/// the tables, where there is room for them, or the upgrades of older ones.
fn work_for(found: &Found, schema: &Schema) -> Option<(&'static str, String)> {
    let (what, sql) = match (found, found.older()) {
        (Found::Room, _) => ("create the schema", TABLES.to_owned()),
        (_, Some(version)) => (
            "bring the schema up to date",
            UPGRADES[usize::try_from(version - 1).expect("from 1")..].concat() + MARK_THEM,
        ),
        _ => return None,
    };
    let sql = sql
        .replace("{schema}", &schema.quoted)
        .replace("{marker}", &format!("{MARK}{SCHEMA_VERSION}"));
    Some((what, sql))
}

/// Makes sure `schema` is lockrun's, of this version, and says which
/// version its tables are, when they are there. When it is missing or empty,
/// they are created if `create` (running a command), else left so (`status`
/// and `release` only look); an older version is brought up to date likewise.
/// A schema that is someone else's or a newer lockrun's is refused,
/// untouched. Costs one round trip when the schema is already there; concurrent
/// first uses are safe: creating takes an advisory lock and looks again.
pub fn create_or_check(
    session: &mut Session,
    schema: &Schema,
    create: bool,
    within: Duration,
) -> Result<Option<i64>, Failure> {
    let name = schema.name();
    let mut found = session.call("check the schema", within, async |client: &Client| {
        inspect(client, schema).await
    })?;
    let work = work_for(&found, schema);
    if !create && work.is_some() {
        return Ok(found.older());
    }
    // What the look above saw may be another lockrun's first use half done:
    // the schema there, its tables not yet. So anything short of a complete
    // schema of this version is looked at again under the lock that every
    // maker holds, and made (or brought up to date) as that look says.
    if create && (work.is_some() || found == Found::Foreign) {
        let what = work.map_or("check the schema", |(what, _)| what);
        found = session.transaction(what, within, async |client: &Client| {
            client
                .query_typed(
                    "SELECT pg_advisory_xact_lock($1, hashtext($2))",
                    &[(&LOCK_CLASS, Type::INT4), (&name, Type::TEXT)],
                )
                .await?;
            let found = inspect(client, schema).await?;
            let Some((_, sql)) = work_for(&found, schema) else {
                return Ok(found);
            };
            client.batch_execute(&sql).await?;
            Ok(Found::Lockrun {
                version: SCHEMA_VERSION,
                complete: true,
            })
        })?;
    }
    let refuse = |why: String| {
        Failure::new(
            Kind::Permanent,
            format!(
                "PostgreSQL at {}: schema {:?} {why}; refusing to touch it (choose another --prefix)",
                session.target(),
                schema.name
            ),
        )
    };
    match found {
        // Not left so: a look returns above, a run makes the tables.
        Found::Room => Ok(None),
        Found::Lockrun {
            version: SCHEMA_VERSION,
            complete: true,
        } => Ok(Some(SCHEMA_VERSION)),
        Found::Lockrun {
            version: SCHEMA_VERSION,
            complete: false,
        } => Err(refuse("is lockrun's but lacks some of its tables".into())),
        Found::Lockrun { version, .. } if version > SCHEMA_VERSION => Err(Failure::new(
            Kind::Permanent,
            newer_format(
                &format!(
                    "PostgreSQL at {}: schema {:?}",
                    session.target(),
                    schema.name
                ),
                "schema version",
                version,
                u32::try_from(SCHEMA_VERSION).expect("small"),
            ),
        )),
        Found::Lockrun { version, .. } => Err(refuse(format!(
            "was made by another lockrun (schema version {version}; this lockrun knows {SCHEMA_VERSION})"
        ))),
        Found::Foreign => Err(refuse("is not lockrun's: it holds other objects".into())),
    }
}

/// Reads the catalog: whether the schema exists, its mark and how many of
/// lockrun's tables it has, in one statement that finds the schema and its
/// tables by index, which a session plans and runs in half the time of a join
/// over the catalog (every run makes it); and, for a schema without
/// lockrun's mark only, whether anything at all is in it, in another (a fresh
/// session plans the search of every kind of object dearly, and the schema is
/// nearly always lockrun's). The schema is found by a scan of `pg_namespace`,
/// which needs no privilege on it, and not by `to_regnamespace`: that reads
/// a later catalog than the statement's, and would see another lockrun's
/// schema just committed while the tables in it are not yet seen.
async fn inspect(client: &Client, schema: &Schema) -> Result<Found, tokio_postgres::Error> {
    let rows = client
        .query_typed(
            "SELECT s.oid IS NOT NULL,
                    (SELECT d.description FROM pg_catalog.pg_description d
                      WHERE d.objoid = (SELECT c.oid FROM pg_catalog.pg_class c
                                         WHERE c.relnamespace = s.oid AND c.relname = 'holders'
                                           AND c.relkind = 'r')
                        AND d.classoid = 'pg_catalog.pg_class'::pg_catalog.regclass
                        AND d.objsubid = 0),
                    (SELECT count(*) FROM pg_catalog.pg_class c
                      WHERE c.relnamespace = s.oid AND c.relname = ANY($2) AND c.relkind = 'r')
               FROM (SELECT (SELECT n.oid FROM pg_catalog.pg_namespace n
                              WHERE n.nspname = $1) AS oid) AS s",
            &[
                (&schema.name, Type::TEXT),
                (&&TABLE_NAMES[..], Type::TEXT_ARRAY),
            ],
        )
        .await?;
    let row = &rows[0];
    let (present, mark, tables): (bool, Option<String>, i64) = (row.get(0), row.get(1), row.get(2));
    let version = mark
        .as_deref()
        .and_then(|mark| mark.strip_prefix(MARK))
        .and_then(|version| version.parse().ok());
    Ok(match version {
        Some(version) => Found::Lockrun {
            version,
            complete: usize::try_from(tables) == Ok(TABLE_NAMES.len()),
        },
        None if present && occupied(client, &schema.name).await? => Found::Foreign,
        None => Found::Room,
    })
}

/// Whether schema `name` holds anything: a table, a function, a type of its
/// own (not the row and array types of tables).
async fn occupied(client: &Client, name: &str) -> Result<bool, tokio_postgres::Error> {
    let rows = client
        .query_typed(
            "SELECT EXISTS (SELECT FROM pg_class c WHERE c.relnamespace = n.oid)
                    OR EXISTS (SELECT FROM pg_proc p WHERE p.pronamespace = n.oid)
                    OR EXISTS (SELECT FROM pg_type t WHERE t.typnamespace = n.oid
                                AND t.typrelid = 0 AND t.typcategory <> 'A')
               FROM pg_namespace n WHERE n.nspname = $1",
            &[(&name, Type::TEXT)],
        )
        .await?;
    Ok(rows.first().is_some_and(|row| row.get(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_is_quoted_and_bounded() {
        let schema = Schema::new("my \"locks\"").unwrap();
        assert_eq!(schema.table("holders"), "\"my \"\"locks\"\"\".holders");
        assert_eq!(schema.name(), "my \"locks\"");
        for bad in ["", "a\0b", &"x".repeat(64)] {
            assert!(matches!(Schema::new(bad), Err(Error::Usage(_))));
        }
        assert!(Schema::new(&"é".repeat(31)).is_ok());
    }

    #[test]
    fn the_tables_fill_in_the_schema_and_the_mark() {
        assert!(TABLES.contains("{schema}.holders") && TABLES.contains("'{marker}'"));
        for table in TABLE_NAMES {
            assert!(
                TABLES.contains(&format!("CREATE TABLE {{schema}}.{table} (")),
                "{table}"
            );
        }
    }
}
