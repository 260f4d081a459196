//! The pure logic of litebase_streams, without pgrx or a server: shared by
//! the extension, the gateway and client libraries, and tested with plain
//! `cargo test -p litebase-streams-core`.
//!
//! * [`names`]: stream names and patterns (the naming rule);
//! * [`json`]: the canonical JSON form of an event (every path's);
//! * [`payload`]: notification payloads (compact JSON, truncation);
//! * [`envelope`]: the limits of an event's type, key and headers;
//! * [`filters`]: event filters by type and data containment;
//! * [`horizon`]: the no-missed-event invariant and the horizon arithmetic;
//! * [`backoff`]: the workers' retry schedules;
//! * [`hosts`]: the address policy of webhook URLs;
//! * [`keys`]: key paths of subscriptions ordered per key, and key hashes;
//! * [`signing`]: Standard Webhooks signatures and secrets.

pub mod backoff;
pub mod envelope;
pub mod filters;
pub mod horizon;
pub mod hosts;
pub mod json;
pub mod keys;
pub mod names;
pub mod payload;
pub mod signing;
