//! The SQL of every look and change, in lockrun's schema (`{schema}` filled
//! in once per store). Plain statements from the client, no functions in
//! the database: a lockrun of another version that shares the schema runs
//! its own, and the statements need only the tables' privileges.
//!
//! The line stands in places: consecutive sharers in one place, as they go
//! together (docs/guide.md: "Shared locks"), an exclusive waiter alone. Whoever
//! frees a slot grants it, in the same transaction, to the waiters at the
//! head whom the line lets in (all the sharers there at once), and tells
//! them; each then claims its slot without the name's lock, so a group's
//! claims do not wait for each other. Other wake-ups go to the first two
//! places, and a waiter watches the place just ahead of it.
//!
//! A change to a name's holders or waiters first locks the name's row in
//! `locks`, so that changes to one name happen one at a time under READ
//! COMMITTED; every statement after that lock sees everything committed
//! before it. A look from a waiter that only keeps its place, or from a
//! `--no-wait` run before it takes a slot, takes no such lock. Times are the
//! server's: `now()` (the transaction's start) dates leases and places,
//! `clock_timestamp()` says how long they have left.

use super::prepared::PreparedWake;
use super::schema::{MODES_SINCE, Schema};
use crate::backend::MAX_SHARERS;

/// `NOTIFY` channels are this and a waiter's token (a release wakes the waiters
/// it granted slots to, not the line).
pub const CHANNEL_PREFIX: &str = "lockrun:";
/// A wake-up's payload: a slot was granted to us. This word, a space, the
/// slot's number, a space and its fence: the grantee holds it from then on,
/// needing no call before its command starts. The word alone (from a lockrun
/// before the number and fence came with it): claim it.
pub const GRANTED: &str = "granted";
/// A wake-up's payload: the line moved up; look where we stand.
pub const LINE_MOVED: &str = "line";

/// A slot a wake-up granted us.
#[derive(Clone, Copy)]
pub enum Grant {
    /// This slot, with this fence.
    Said(u32, u64),
    /// One it does not say (see [`GRANTED`]): to be claimed.
    Unsaid,
}

/// The slot a wake-up's `payload` grants us, if it grants one.
pub fn granted(payload: &str) -> Option<Grant> {
    let mut words = payload.split(' ');
    if words.next() != Some(GRANTED) {
        return None;
    }
    let slot = words.next().and_then(|slot| slot.parse().ok());
    let fence = words.next().and_then(|fence| fence.parse().ok());
    Some(match (slot, fence) {
        (Some(slot), Some(fence)) => Grant::Said(slot, fence),
        _ => Grant::Unsaid,
    })
}

/// The statements, for one schema. For tables older than modes, which
/// `status` and `release` read as they are, only theirs are fit: `list`,
/// `lock`, `break_slots` (every row exclusive) and `wake`, which then only
/// tells the first two waiters to look, as their lockruns expect.
pub struct Sql {
    /// $1 name. Locks the name's row, made on its first use.
    pub lock_new: String,
    /// $1 name. Locks the name's row, if the name was ever used.
    pub lock: String,
    /// $1 name. Drops the holders and waiters whose leases or places lapsed
    /// (housekeeping: every other statement passes over them).
    pub purge: String,
    /// $1 name, $2 token, $3 parallelism, $4 TTL ms, $5-$9 pid, start time,
    /// boot id, host, command, $11 mode. Takes the lowest free slot (a lapsed
    /// lease's is free) when the line lets us (`Request::admitted`) and no
    /// holder or waiter has another `-p` (docs/guide.md: "Slots"), leaving the line,
    /// or finds the slot ours already (a repeat after a lost reply) and renews
    /// it: (slot, fence), or no row.
    pub take: String,
    /// $1 name, $2 token, $3 parallelism, $4 TTL ms, $5-$9 as for `take`, $10
    /// whether to join, $11 mode. Unless we hold a slot now, or a holder or waiter has
    /// another `-p`: joins the line at its end, or keeps our place for another TTL.
    pub join: String,
    /// $1 name, $2 token, $4 TTL ms. Renews the lease of the slot we hold
    /// (granted to us, or taken before a lost reply), if it has not lapsed,
    /// without the name's lock: (slot, fence), or no row.
    pub claim: String,
    /// $2 token, $4 TTL ms. Keeps our place in line for another TTL, if it has not lapsed.
    pub keep_place: String,
    /// $2 token, $4 TTL ms, $5 another waiter's token. Keeps our place as
    /// `keep_place` does (one row if it was there to keep: not lapsed, nor
    /// become a slot granted to us), and says whether that waiter still stands in line.
    pub keep_place_behind: String,
    /// $1 name, $2 channel prefix, $3 whether the line moved. Grants free
    /// slots to the waiters at the head whom the line lets in
    /// (`Request::admitted` for each, those ahead of it let in first), in
    /// line order, their leases ending where their places did, and tells them
    /// (`GRANTED`, with the slot and fence); when the line moved (a waiter took a slot or left, or
    /// this granted any), tells those of the next two places (`LINE_MOVED`),
    /// which watch what is ahead of them.
    pub wake: String,
    /// The wake, ready to be prepared in a session ahead of its use; none for
    /// tables older than modes.
    pub prepared_wake: Option<PreparedWake>,
    /// $1 name, $2 token, $3 parallelism, $7 boot id, $8 host, $11 mode. Where we stand: our
    /// position (0: not in line) and place, whether the line lets us take a
    /// slot, the live holders and the waiters of the place just ahead as JSON
    /// (owner, `kept`, `left_ms` until the lease or place ends; a holder's
    /// `slot`, `fence`, `since_ms` and `expires_ms` too), and another
    /// `-p` that a holder or waiter has, if one does, the waiter nearest
    /// ahead of us on our boot and host, and the one of our boot and host
    /// nearest the head within the listening places ahead of us (see
    /// [`super::listener_places`]): once it has ended, we are among them. As
    /// JSON like those.
    pub report: String,
    /// The parameters of `report`. The report for a run that stands in no
    /// line (`--no-wait`): its columns, with no position, place or neighbours,
    /// so that of the line the server reads only whether a waiter stands
    /// ahead; admitted when a slot is free to a newcomer, or is ours already
    /// (a repeat after a lost reply: the take renews it). Takes no lock: it
    /// can answer a busy run alone.
    pub outside_report: String,
    /// $1 name, $2 tokens. Drops dead holders (not kept ones) and waiters.
    pub evict: String,
    /// $1 name, $2 slot, $3 token, $4 TTL ms. Renews a lease that has not
    /// lapsed (never revives one): one row when renewed.
    pub renew: String,
    /// $1 name, $2 slot, $3 token. Frees the slot: one row when it was still ours.
    pub release: String,
    /// $1 name, $2 slot, $3 token, $4 ms. Keeps the slot taken that long
    /// (`--min-hold`) though its holder leaves, if its lease has not lapsed: one row when kept.
    pub keep: String,
    /// $1 name or NULL for all. Holders and waiters, name by name, holders by
    /// slot and waiters in line order; times in epoch milliseconds.
    pub list: String,
    /// $1 name, $2 slot or NULL for all. Breaks leases: the rows deleted, as `list` gives them.
    pub break_slots: String,
}

/// Milliseconds from now until `expires_at`, by the server's clock.
const LEFT_MS: &str = "(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint";

impl Sql {
    #[allow(clippy::too_many_lines)] // one SQL text per field, nothing else
    pub fn new(schema: &Schema, version: i64) -> Self {
        let holders = schema.table("holders");
        let waiters = schema.table("waiters");
        let locks = schema.table("locks");
        let mode = if version >= MODES_SINCE {
            "mode"
        } else {
            "'exclusive'::text"
        };
        let owner_json = "'token', token, 'pid', pid, 'start_time', start_time, \
                          'boot_id', boot_id, 'host', host, 'command', command, 'mode', mode";
        // The live line with each waiter's position and place, up to our own when we are in it.
        let line = |up_to: &str| {
            format!(
                "SELECT *, count(*) FILTER (WHERE starts) OVER (ORDER BY ticket) AS place,
                        row_number() OVER (ORDER BY ticket) AS position
                 FROM (SELECT ticket, token, pid, start_time, boot_id, host, command, expires_at,
                              parallelism, {mode} AS mode,
                              {mode} = 'exclusive'
                              OR lag({mode}) OVER (ORDER BY ticket) IS DISTINCT FROM 'shared'
                              AS starts
                       FROM {waiters} WHERE name = $1 AND expires_at > now(){up_to}) AS line"
            )
        };
        let our_ticket = format!(
            "coalesce((SELECT ticket FROM {waiters} WHERE token = $2 AND expires_at > now()),
                      9223372036854775807)"
        );
        // Request::admitted: a sharer goes beside sharers, behind sharers only.
        let capacity = format!("CASE WHEN $11 = 'shared' THEN {MAX_SHARERS} ELSE $3 END");
        let admitted = format!(
            "(SELECT count(*) < {capacity}
                     AND ($11 <> 'shared' OR count(*) FILTER (WHERE mode = 'exclusive') = 0)
              FROM {holders} WHERE name = $1 AND expires_at > now())
             AND NOT EXISTS (SELECT FROM {waiters}
                             WHERE name = $1 AND expires_at > now() AND ticket < {our_ticket}
                               AND ($11 <> 'shared' OR mode <> 'shared'))"
        );
        // A live holder or waiter whose -p is not $3: older lockruns' NULL never is.
        let other_parallelism = format!(
            "SELECT parallelism FROM {holders}
              WHERE name = $1 AND expires_at > now() AND parallelism <> $3
             UNION ALL
             SELECT parallelism FROM {waiters}
              WHERE name = $1 AND expires_at > now() AND parallelism <> $3"
        );
        // The fence is one more than the last, and never below the server's
        // clock in microseconds: it keeps growing even if a failover to a
        // replica that lagged behind lost the last ones.
        let next_fence =
            "greatest(fence + 1, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)";
        let holder_columns = "name, slot, token, fence, pid, start_time, boot_id, host, command, \
                              acquired_at, expires_at, parallelism, mode";
        // A lapsed holder's row in the slot is taken over.
        let take_over = "ON CONFLICT (name, slot) DO UPDATE SET
                           token = excluded.token, fence = excluded.fence, pid = excluded.pid,
                           start_time = excluded.start_time, boot_id = excluded.boot_id,
                           host = excluded.host, command = excluded.command,
                           acquired_at = excluded.acquired_at, expires_at = excluded.expires_at,
                           kept = false, parallelism = excluded.parallelism, mode = excluded.mode
                         WHERE h.expires_at <= now()";
        let claim = format!(
            "UPDATE {holders} SET expires_at = now() + $4 * interval '1 millisecond'
             WHERE name = $1 AND token = $2 AND NOT kept AND expires_at > now()
             RETURNING slot, fence"
        );
        // When a holder took its slot and when its lease ends, in epoch milliseconds.
        let holder_times = "'since_ms', (extract(epoch FROM acquired_at) * 1000)::bigint, \
                            'expires_ms', (extract(epoch FROM expires_at) * 1000)::bigint";
        // The live holders (`live`) as the report gives them, by slot.
        let live_holders = format!(
            "(SELECT json_agg(json_build_object({owner_json}, 'kept', kept, 'left_ms', {LEFT_MS},
                                                'slot', slot, 'fence', fence, {holder_times})
                              ORDER BY slot)
              FROM live)::text"
        );
        let list_columns = format!(
            "token, pid, start_time, boot_id, host, command, {mode} AS mode,
             (extract(epoch FROM expires_at) * 1000)::bigint AS expires_ms"
        );
        let keep_place = format!(
            "UPDATE {waiters} SET expires_at = now() + $4 * interval '1 millisecond'
             WHERE token = $2 AND expires_at > now()"
        );
        let mut sql = Self {
            lock_new: format!(
                "INSERT INTO {locks} AS l (name) VALUES ($1)
                 ON CONFLICT (name) DO UPDATE SET fence = l.fence"
            ),
            lock: format!("SELECT FROM {locks} WHERE name = $1 FOR UPDATE"),
            purge: format!(
                "WITH lapsed AS (DELETE FROM {holders} WHERE name = $1 AND expires_at <= now())
                 DELETE FROM {waiters} WHERE name = $1 AND expires_at <= now()"
            ),
            take: format!(
                "WITH ours AS ({claim}), free AS (
                   SELECT min(s) AS slot FROM generate_series(0, {capacity} - 1) AS s
                   WHERE NOT EXISTS (SELECT FROM ours)
                     AND s NOT IN (SELECT slot FROM {holders} WHERE name = $1 AND expires_at > now())
                     AND {admitted}
                     AND NOT EXISTS ({other_parallelism})
                   HAVING min(s) IS NOT NULL
                 ), fence AS (
                   UPDATE {locks} SET fence = {next_fence}
                   WHERE name = $1 AND EXISTS (SELECT FROM free)
                   RETURNING fence
                 ), taken AS (
                   INSERT INTO {holders} AS h ({holder_columns})
                   SELECT $1, free.slot, $2, fence.fence, $5, $6, $7, $8, $9,
                          now(), now() + $4 * interval '1 millisecond', $3, $11
                   FROM free, fence
                   {take_over}
                   RETURNING slot, fence
                 ), left_line AS (
                   DELETE FROM {waiters} WHERE token = $2
                     AND (EXISTS (SELECT FROM taken) OR EXISTS (SELECT FROM ours))
                 )
                 SELECT slot, fence FROM ours UNION ALL SELECT slot, fence FROM taken"
            ),
            join: format!(
                "INSERT INTO {waiters} (name, token, pid, start_time, boot_id, host, command,
                                        since, expires_at, parallelism, mode)
                 SELECT $1, $2, $5, $6, $7, $8, $9, now(), now() + $4 * interval '1 millisecond',
                        $3, $11
                 WHERE $10 AND NOT EXISTS (SELECT FROM {holders} WHERE name = $1 AND token = $2)
                   AND NOT EXISTS ({other_parallelism})
                 ON CONFLICT (token) DO UPDATE SET expires_at = excluded.expires_at"
            ),
            claim,
            keep_place_behind: format!(
                "{keep_place}
                 RETURNING EXISTS (SELECT FROM {waiters} WHERE token = $5 AND expires_at > now())"
            ),
            keep_place,
            wake: if version >= MODES_SINCE {
                format!(
                    "WITH line AS ({line}), room AS (
                       SELECT count(*) AS held, count(*) FILTER (WHERE mode = 'exclusive') AS alone
                       FROM {holders} WHERE name = $1 AND expires_at > now()
                     ), let_in AS (
                       SELECT line.*,
                              every(CASE WHEN mode = 'shared'
                                         THEN place = 1 AND alone = 0
                                              AND held + position <= {MAX_SHARERS}
                                         ELSE place = position
                                              AND held + position <= coalesce(parallelism, 1) END)
                                OVER (ORDER BY ticket) AS admitted
                       FROM line, room
                     ), granted AS (
                       SELECT * FROM let_in WHERE admitted
                     ), free AS (
                       -- Enough slot numbers for all of them, whichever the holders have.
                       SELECT s AS slot, row_number() OVER (ORDER BY s) AS position
                       FROM generate_series(
                              0, (SELECT held FROM room) + (SELECT count(*) FROM granted) - 1) AS s
                       WHERE s NOT IN (SELECT slot FROM {holders}
                                       WHERE name = $1 AND expires_at > now())
                     ), fence AS (
                       UPDATE {locks} SET fence = {next_fence} + (SELECT count(*) FROM granted) - 1
                       WHERE name = $1 AND EXISTS (SELECT FROM granted)
                       RETURNING fence
                     ), taken AS (
                       INSERT INTO {holders} AS h ({holder_columns})
                       SELECT $1, free.slot, g.token,
                              fence.fence - (SELECT count(*) FROM granted) + g.position,
                              g.pid, g.start_time, g.boot_id, g.host, g.command,
                              now(), g.expires_at, g.parallelism, g.mode
                       FROM granted AS g JOIN free USING (position), fence
                       {take_over}
                       RETURNING token, slot, fence
                     ), left_line AS (
                       DELETE FROM {waiters} WHERE token IN (SELECT token FROM taken)
                     )
                     SELECT pg_notify($2 || token, concat_ws(' ', '{GRANTED}', slot, fence)) FROM taken
                     UNION ALL
                     SELECT pg_notify($2 || token, '{LINE_MOVED}') FROM let_in
                     -- Slots granted move the line too: a dead waiter may be
                     -- its head now, which the ones behind must see.
                     WHERE ($3 OR EXISTS (SELECT FROM granted)) AND NOT admitted
                       AND place <= coalesce((SELECT max(place) FROM granted), 0) + 2",
                    line = line("")
                )
            } else {
                format!(
                    "SELECT pg_notify($2 || token, '{LINE_MOVED}')
                     FROM (SELECT token FROM {waiters} WHERE name = $1 AND expires_at > now()
                           ORDER BY ticket LIMIT 2) AS first"
                )
            },
            report: format!(
                "WITH line AS ({line}), mine AS (
                   SELECT position, place FROM line WHERE token = $2
                 ), live AS (
                   SELECT * FROM {holders} WHERE name = $1 AND expires_at > now()
                 )
                 SELECT coalesce((SELECT position FROM mine), 0)::integer,
                        coalesce((SELECT place FROM mine), 0)::integer,
                        {admitted},
                        {live_holders},
                        (SELECT json_agg(json_build_object({owner_json}, 'kept', false,
                                                           'left_ms', {LEFT_MS}))
                         FROM line WHERE place = (SELECT place FROM mine) - 1)::text,
                        ({other_parallelism} LIMIT 1),
                        (SELECT json_build_object({owner_json}, 'kept', false,
                                                  'left_ms', {LEFT_MS})
                         FROM line WHERE position < (SELECT position FROM mine)
                                     AND boot_id = $7 AND host = $8
                         ORDER BY position DESC LIMIT 1)::text,
                        (SELECT json_build_object({owner_json}, 'kept', false,
                                                  'left_ms', {LEFT_MS})
                         FROM line WHERE position < (SELECT position FROM mine)
                                     AND place >= (SELECT place FROM mine) - least($3 + {spare}, {most})
                                     AND position >= (SELECT position FROM mine) - {most}
                                     AND boot_id = $7 AND host = $8
                         ORDER BY position LIMIT 1)::text",
                line = line(&format!(" AND ticket <= {our_ticket}")),
                spare = super::SPARE_LISTENERS,
                most = super::MAX_LISTENERS,
            ),
            outside_report: format!(
                "WITH live AS (SELECT * FROM {holders} WHERE name = $1 AND expires_at > now())
                 SELECT 0::integer, 0::integer,
                        ({admitted}) OR EXISTS (SELECT FROM live WHERE token = $2 AND NOT kept),
                        {live_holders}, NULL::text,
                        ({other_parallelism} LIMIT 1), NULL::text, NULL::text"
            ),
            evict: format!(
                "WITH dead AS (
                   DELETE FROM {holders} WHERE name = $1 AND token = ANY($2) AND NOT kept
                 )
                 DELETE FROM {waiters} WHERE name = $1 AND token = ANY($2)"
            ),
            renew: format!(
                "UPDATE {holders} SET expires_at = now() + $4 * interval '1 millisecond'
                 WHERE name = $1 AND slot = $2 AND token = $3 AND NOT kept AND expires_at > now()
                 RETURNING 1"
            ),
            release: format!(
                "DELETE FROM {holders} WHERE name = $1 AND slot = $2 AND token = $3 RETURNING slot"
            ),
            keep: format!(
                "UPDATE {holders} SET kept = true, expires_at = now() + $4 * interval '1 millisecond'
                 WHERE name = $1 AND slot = $2 AND token = $3 AND expires_at > now()
                 RETURNING slot"
            ),
            list: format!(
                "SELECT name, slot, fence, kept, NULL::bigint AS ticket,
                        (extract(epoch FROM acquired_at) * 1000)::bigint AS since_ms, {list_columns}
                 FROM {holders} WHERE ($1::text IS NULL OR name = $1) AND expires_at > now()
                 UNION ALL
                 SELECT name, NULL, NULL, false, ticket,
                        (extract(epoch FROM since) * 1000)::bigint, {list_columns}
                 FROM {waiters} WHERE ($1::text IS NULL OR name = $1) AND expires_at > now()
                 ORDER BY name, ticket NULLS FIRST, slot"
            ),
            break_slots: format!(
                "DELETE FROM {holders}
                 WHERE name = $1 AND ($2::integer IS NULL OR slot = $2) AND expires_at > now()
                 RETURNING name, slot, fence, kept, NULL::bigint AS ticket,
                           (extract(epoch FROM acquired_at) * 1000)::bigint AS since_ms,
                           {list_columns}"
            ),
            prepared_wake: None,
        };
        if version >= MODES_SINCE {
            sql.prepared_wake = Some(PreparedWake::new(&sql));
        }
        sql
    }
}
