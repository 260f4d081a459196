//! Hooks into PostgreSQL's own commands.
//!
//! * `drop_database`: the ProcessUtility hook that gets a database's workers
//!   out of the way of `DROP DATABASE`.

pub mod drop_database;
