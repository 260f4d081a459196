//! Hooks into PostgreSQL's own commands.
//!
//! * `drop_database`: the ProcessUtility hook that gets a database's workers
//!   out of the way of `DROP DATABASE`, and refuses `LOCK` of the
//!   extension's relations to roles that do not own them.
//! * `partitions`: refuses TRUNCATE, DROP and DETACH of the log's
//!   partitions, and gives an attached one row-level security.

pub mod drop_database;
pub mod partitions;
