//! The etcd backend's groundwork: a blocking client of etcd's v3 API over its
//! JSON gateway ([`client`]); the lock recipe on top comes with the backend.

pub mod client;
