-- lockrun's tables, in the schema that --prefix names ({schema}: its quoted
-- name). Created in one transaction on first use (schema.rs). Every time is
-- the server's (now()), never a client's.

CREATE SCHEMA IF NOT EXISTS {schema};

-- One row per lock name, never deleted. `fence` is the last fencing token
-- handed out for the name: it only ever grows (one more than the last, never
-- below the server's clock in microseconds: sql.rs), and lives in a row rather
-- than a sequence so that it is replicated like any row. Every change to a
-- name's holders and waiters locks this row first (SELECT ... FOR UPDATE), so
-- changes to one name happen one at a time under READ COMMITTED, while other
-- names go on in parallel.
CREATE TABLE {schema}.locks (
    name text PRIMARY KEY,
    fence bigint NOT NULL DEFAULT 0 CHECK (fence >= 0)
);

-- The slots taken. A lease runs until expires_at; a row whose lease has run
-- out is a free slot, taken over (or deleted) by the next acquirer. `kept`:
-- its holder released it, but --min-hold keeps it taken until expires_at.
-- pid, start_time and boot_id let a lockrun on the same host free the slot
-- of a holder whose process is gone, without waiting for its lease.
CREATE TABLE {schema}.holders (
    name text NOT NULL,
    slot integer NOT NULL CHECK (slot >= 0),
    token text NOT NULL,
    fence bigint NOT NULL,
    pid integer NOT NULL,
    start_time bigint NOT NULL,
    boot_id text NOT NULL,
    host text NOT NULL,
    command text NOT NULL,
    acquired_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    kept boolean NOT NULL DEFAULT false,
    PRIMARY KEY (name, slot),
    -- Its -p (a name's slot count is part of the lock); NULL from lockruns before version 2.
    parallelism integer,
    -- 'shared' or 'exclusive' (docs/guide.md: "Shared locks"); rows from before version 3 held alone.
    mode text NOT NULL DEFAULT 'exclusive'
);

-- The waiting line: first come (lowest ticket), first served. A waiter keeps
-- its row alive by moving expires_at on while it waits; one that stops doing
-- so (or whose process is gone, seen from the same host) leaves the line.
CREATE TABLE {schema}.waiters (
    ticket bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL,
    token text NOT NULL UNIQUE,
    pid integer NOT NULL,
    start_time bigint NOT NULL,
    boot_id text NOT NULL,
    host text NOT NULL,
    command text NOT NULL,
    since timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    parallelism integer,
    mode text NOT NULL DEFAULT 'exclusive'
);
CREATE INDEX waiters_in_line ON {schema}.waiters (name, ticket);

-- The mark that this schema is lockrun's, and its version.
COMMENT ON TABLE {schema}.holders IS '{marker}';
