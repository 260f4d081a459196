//! Table capture and the snapshot handoff.
//!
//! `streams.capture(tbl)` makes every INSERT, UPDATE, DELETE and TRUNCATE
//! of a table publish events in the changing transaction: statement-level
//! AFTER triggers with transition tables (manage.rs creates them) call one
//! C function (trigger.rs) that turns a statement's rows into one batch of
//! events, with the table owner's publish privilege. The capture is the
//! triggers themselves: DROP TABLE ends it, pg_dump keeps it, and
//! `streams.captures` reads it from `pg_trigger`.
//!
//! `streams.snapshot()` (snapshot.rs) tells a consumer that copies tables in
//! a REPEATABLE READ transaction which events its copy already holds.

pub mod manage;
pub mod snapshot;
pub mod trigger;
