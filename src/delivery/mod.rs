//! Delivery: the launcher, one background worker per database and its
//! rounds. A round computes the horizon, records the commit times of what
//! became final, notifies it in position order and persists the horizon, in
//! one transaction whose synchronous commit is what makes those events
//! final (so no crash takes back an event a reader saw).
//!
//! * `launcher`: starts a worker for every database that needs one;
//! * `worker`: the worker's loop (when to run a round, backoff);
//! * `round`: one round, `plans`: its statements, and `bounded`: reading an
//!   event's values for a payload within its limit;
//! * `runtime`: transactions, failures and the pinned session settings, also
//!   for the webhook worker;
//! * `maintenance`: BRIN summarising and merging commit times;
//! * `stream_stats`: counting events per stream (`streams.streams`, `streams.metrics()`);
//! * `status`: the shared-memory half of `streams.status`.

mod bounded;
pub mod launcher;
pub mod maintenance;
mod plans;
pub mod round;
pub mod runtime;
pub mod status;
mod storage;
mod stream_stats;
pub mod worker;
