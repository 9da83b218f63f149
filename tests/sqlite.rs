//! The SQLite backend's own guarantees (SPEC §4): leases, same-host reclaim, refusing foreign files.

use crate::support::*;

crate::backend_tests!(sqlite_backend, Store::sqlite());
