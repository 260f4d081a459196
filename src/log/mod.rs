//! The log: appending events (`publish`, `publish_batch`) in the caller's
//! transaction, who may publish and read which streams, reading it back
//! (`replay`), the commit time of every final event, and the catalog
//! lookups that find the extension's own tables.
//!
//! The invariant it keeps with the delivery worker: a publishing
//! transaction announces itself in shared memory before it takes its first
//! position and leaves only at commit or abort, so the horizon never passes
//! a position that may still appear (see litebase_streams_core::horizon).

pub mod announce;
pub mod append;
pub mod catalog;
pub mod commit_times;
pub mod envelope;
pub mod expected;
pub mod hold;
pub mod idempotency;
pub mod kept_plan;
pub mod partitions;
pub mod privileges;
pub mod publish;
pub mod redact;
pub mod replay;
pub mod to_json;
