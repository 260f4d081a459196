//! The one error type of litebase_streams, and the one place where each kind of
//! failure gets its SQLSTATE, message and hint.
//!
//! Functions return `Result<_, StreamsError>`; `raise` turns an error into a
//! PostgreSQL ERROR, so a user always learns about bad input through a SQLSTATE,
//! never through a panic.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{function_name, PgLogLevel, PgSqlErrorCode};
use std::fmt;

use litebase_streams_core::filters::FilterError;
use litebase_streams_core::names::{NameError, STREAM_NAME_RULE};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamsError {
    /// A stream name (or pattern) that breaks the naming rule.
    InvalidStreamName { name: String, reason: &'static str },
    /// A NULL where a value is required; names the argument.
    NullArgument(&'static str),
    /// A number argument below zero where it may not be.
    NegativeArgument { argument: &'static str, value: i64 },
    /// A number argument outside `min..=max`.
    ArgumentOutOfRange { argument: &'static str, value: i64, min: i64, max: i64 },
    /// An interval argument below zero.
    NegativeInterval { argument: &'static str },
    /// An interval argument too large to wait for.
    IntervalOutOfRange { argument: &'static str },
    /// PostgreSQL's strong random source failed (making a webhook secret).
    NoRandomSource,
    /// The library was not loaded through `shared_preload_libraries`, or
    /// `track_commit_timestamp` is off.
    NotPreloaded { preloaded: bool, commit_timestamps: bool },
    /// This backend's slot number does not fit the shared slot table.
    NoPublisherSlot(i32),
    /// A transaction that published events tried to PREPARE.
    PreparedPublish,
    /// `streams.position_seq` handed out a position at or below the horizon:
    /// someone moved it back (`setval` needs only UPDATE on it, which
    /// `pg_write_all_data` has). Publishing it would put an event where
    /// readers have already passed.
    PositionBelowHorizon { position: i64, horizon: u64 },
    /// The current user lacks a stream privilege.
    PermissionDenied { privilege: &'static str, stream: String },
    /// An event's data is larger than `litebase_streams.max_event_size`.
    EventTooLarge { size: usize, limit: usize },
    /// An SPI call of the extension's own failed (a bug or a broken
    /// installation): what it was doing, and SPI's answer.
    Spi { doing: &'static str, error: String },
    /// An object of the extension is missing (dropped by hand).
    MissingObject(&'static str),
    /// A stored event that cannot be read back (storage corruption).
    CorruptEvent { position: i64, error: String },
    /// A WARNING: the commit time of these events was lost before the worker
    /// recorded it (see `inexact` in `streams.commit_times`).
    CommitTimesLost { events: i64, after: i64, through: i64 },
    /// Memory for what the message names could not be allocated.
    OutOfMemory(&'static str),
    /// The database's encoding is not UTF-8.
    NotUtf8,
    /// The worker's round found `streams.horizon_state` written by another
    /// session since it read it (a restore); the round is rolled back.
    HorizonStateChanged,
    /// A subscription name that breaks the naming rule.
    InvalidSubscriptionName { name: String, reason: &'static str },
    /// `create_subscription` with a name that exists.
    DuplicateSubscription(String),
    /// No subscription of that name.
    UnknownSubscription(String),
    /// The caller is not a member of the subscription's owner.
    NotSubscriptionOwner(String),
    /// Several roles the caller belongs to (none of them the caller itself)
    /// own a subscription of that name.
    AmbiguousSubscription { name: String, owners: Vec<String> },
    /// The caller may not read every stream the subscription's pattern selects.
    SubscriptionNotReadable { subscription: String, stream: String },
    /// `ack` of positions this transaction did not poll.
    AckNotPolled { subscription: String, through: i64, polled_through: Option<i64> },
    /// A poll of an unordered subscription, or a long poll, under repeatable
    /// read or serializable.
    PollNeedsReadCommitted { long_poll: bool },
    /// A transaction that holds claims tried to PREPARE.
    PreparedPoll,
    /// A transaction holds claims on as many chunks as it may.
    TooManyClaims { subscription: String, chunks: usize },
    /// `streams.wait` under repeatable read or serializable, for an event
    /// the transaction's snapshot does not show.
    WaitNeedsReadCommitted,
    /// The worker could not write a poll's deliveries down (or none runs).
    DeliveryNotRecorded { worker: bool },
    /// Another transaction holds the attempt records a poll's delivery
    /// would change.
    DeliveryBlocked,
    /// nack of an event that is not the caller's to settle.
    NackNotDelivered { subscription: String, position: i64, reason: &'static str },
    /// A text argument longer than its limit.
    TextTooLong { argument: &'static str, limit: usize },
    /// create_subscription(if_not_exists => true) found one that differs.
    SubscriptionDiffers { name: String, differs: &'static str },
    /// A dead-letter function for a position that is not parked.
    NotADeadLetter { subscription: String, position: i64 },
    /// backoff_min above backoff_max.
    BackoffOrder,
    /// A type, key, headers or idempotency key that breaks the envelope's rules.
    InvalidEnvelope { argument: &'static str, reason: String },
    /// A `types` or `filter` argument that breaks the filters' rules.
    InvalidFilter { argument: &'static str, reason: String },
    /// An idempotency key remembered for other events than the ones asked.
    IdempotencyKeyReused { stream: String, key: String, position: i64 },
    /// publish(expected_prev => p) found the stream's newest event elsewhere.
    UnexpectedPrev { stream: String, expected: i64, actual: i64 },
    /// An ack, nack or extend_lease of a lease that expired or was taken over.
    LeaseGone { subscription: String, lease: i64 },
    /// LOCK of a relation of schema streams by a role that does not own it.
    LockReserved(String),
    /// key => ... with ordered => false.
    KeyNeedsOrdered,
    /// A key that is not '$key', '$stream' or a path into data.
    InvalidKeyPath { key: String, reason: &'static str },
    /// on_dead_letter other than 'hold' or 'skip'.
    InvalidOnDeadLetter(String),
    /// A lease asked of a subscription not ordered in one sequence.
    NeedsOrdered { function: &'static str, subscription: String },
    /// A webhook URL that is malformed, not http(s), or names a host the
    /// address policy refuses.
    InvalidWebhookUrl { url: String, reason: String },
    /// A webhook secret that is not `whsec_` and base64 of 24 to 64 bytes.
    InvalidWebhookSecret,
    /// No webhook of that name.
    UnknownWebhook(String),
    /// poll, ack or drop_subscription of a webhook's subscription.
    WebhookSubscription(String),
    /// capture of something that is not an ordinary or partitioned table.
    CaptureNotATable { table: String, kind: &'static str },
    /// capture of a temporary table or of a partition.
    CaptureUnsupported { table: String, reason: &'static str },
    /// capture of a table without a key to name its rows.
    CaptureWithoutKey(String),
    /// capture of a table already captured.
    AlreadyCaptured(String),
    /// uncapture of a table not captured.
    NotCaptured(String),
    /// capture or uncapture by a role that does not own the table.
    NotTableOwner(String),
    /// capture's exclude names a column that is not there, or a key column.
    InvalidExclude { table: String, column: String, reason: &'static str },
    /// The capture trigger called otherwise than as capture made it.
    CaptureMisused(&'static str),
    /// snapshot() outside a repeatable-read transaction.
    SnapshotNeedsRepeatableRead,
    /// snapshot() after the transaction wrote something.
    SnapshotAfterWrites,
    /// UPDATE, DELETE or TRUNCATE of stored events (other than a redaction).
    ImmutableEvents { operation: &'static str, table: String },
    /// `COPY streams.event_log TO`: the log is partitioned.
    CopyOfPartitionedLog,
    /// redact() of a position that holds no final event.
    NoSuchEvent(i64),
    /// redact_matching() without a filter or a key.
    RedactionNeedsSelection,
}

/// What PostgreSQL reports for one error: errmsg (one line), errdetail
/// (the specifics), errhint (what to do).
struct Described {
    sqlstate: PgSqlErrorCode,
    message: String,
    detail: Option<String>,
    hint: Option<String>,
}

fn described(sqlstate: PgSqlErrorCode, message: impl Into<String>) -> Described {
    Described { sqlstate, message: message.into(), detail: None, hint: None }
}

impl Described {
    fn detail(mut self, detail: impl Into<String>) -> Described {
        self.detail = Some(detail.into());
        self
    }

    fn hint(mut self, hint: impl Into<String>) -> Described {
        self.hint = Some(hint.into());
        self
    }
}

/// The naming rule, as a hint.
fn name_rule_hint() -> String {
    sentence(STREAM_NAME_RULE)
}

/// A reason ("it is empty") as a sentence ("It is empty.").
fn sentence(reason: &str) -> String {
    let mut text = reason.to_owned();
    text[..1].make_ascii_uppercase();
    text + "."
}

impl StreamsError {
    /// The one table: every variant's SQLSTATE, message, detail and hint.
    fn describe(&self) -> Described {
        use PgSqlErrorCode::*;
        match self {
            StreamsError::InvalidStreamName { name, reason } => described(
                ERRCODE_INVALID_PARAMETER_VALUE,
                format!("invalid stream name \"{}\"", name.escape_default()),
            )
            .detail(sentence(reason))
            .hint(name_rule_hint()),
            StreamsError::NullArgument(arg) => described(ERRCODE_NULL_VALUE_NOT_ALLOWED, format!("{arg} must not be null")),
            StreamsError::NegativeArgument { argument, value } => {
                described(ERRCODE_INVALID_PARAMETER_VALUE, format!("{argument} must not be negative"))
                    .detail(format!("{argument} was {value}."))
            }
            StreamsError::ArgumentOutOfRange { argument, value, min, max } => {
                described(ERRCODE_INVALID_PARAMETER_VALUE, format!("{argument} must be between {min} and {max}"))
                    .detail(format!("{argument} was {value}."))
            }
            StreamsError::NegativeInterval { argument } => {
                described(ERRCODE_INVALID_PARAMETER_VALUE, format!("{argument} must not be negative"))
            }
            StreamsError::IntervalOutOfRange { argument } => {
                described(ERRCODE_INVALID_PARAMETER_VALUE, format!("{argument} is out of range"))
            }
            StreamsError::NoRandomSource => described(
                ERRCODE_INVALID_PARAMETER_VALUE,
                "no strong random source to make a webhook secret",
            )
            .hint("Pass a secret (secret => 'whsec_...')."),
            StreamsError::NotPreloaded { preloaded, commit_timestamps } => {
                let mut missing = Vec::new();
                if !preloaded {
                    missing.push("shared_preload_libraries = 'litebase_streams'");
                }
                if !commit_timestamps {
                    missing.push("track_commit_timestamp = on");
                }
                described(
                    ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                    "litebase_streams needs shared_preload_libraries and track_commit_timestamp",
                )
                .hint(format!(
                    "Add {} to postgresql.conf (keep any libraries already listed in \
                     shared_preload_libraries), then restart the server.",
                    missing.join(" and ")
                ))
            }
            StreamsError::NoPublisherSlot(procno) => described(
                ERRCODE_INTERNAL_ERROR,
                format!("backend slot {procno} is outside litebase_streams' shared slot table"),
            )
            .hint("Restart the server so the slot table is sized for max_connections."),
            StreamsError::PreparedPublish => described(
                ERRCODE_FEATURE_NOT_SUPPORTED,
                "cannot PREPARE a transaction that published events with litebase_streams",
            )
            .hint("Publish from a transaction that commits directly; two-phase commit is not supported."),
            StreamsError::PositionBelowHorizon { position, horizon } => described(
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("streams.position_seq handed out position {position}, at or below the horizon {horizon}"),
            )
            .hint(format!(
                "The sequence was moved back by hand; nothing was published. A superuser moves it forward: \
                 SELECT setval('streams.position_seq', GREATEST({horizon}, streams._newest_position()));"
            )),
            StreamsError::PermissionDenied { privilege, stream } => described(
                ERRCODE_INSUFFICIENT_PRIVILEGE,
                format!("permission denied to {privilege} stream \"{stream}\""),
            )
            .hint(format!(
                "A superuser or the extension's owner grants it: SELECT streams.grant('{privilege}', '<stream or prefix.*>', '<role>');"
            )),
            StreamsError::EventTooLarge { size, limit } => described(
                ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                format!("event data of {size} bytes exceeds litebase_streams.max_event_size ({limit} bytes)"),
            )
            .hint("Store large payloads elsewhere and publish a reference, or have a superuser raise the setting."),
            StreamsError::Spi { doing, error } => {
                described(ERRCODE_INTERNAL_ERROR, format!("litebase_streams: {doing} failed")).detail(error.clone())
            }
            StreamsError::MissingObject(name) => {
                described(ERRCODE_UNDEFINED_OBJECT, format!("litebase_streams: {name} is missing")).hint(
                    "Objects of the extension must not be dropped by hand: recreate them with \
                     DROP EXTENSION litebase_streams and CREATE EXTENSION litebase_streams (this drops the log; dump it first).",
                )
            }
            StreamsError::CorruptEvent { position, error } => described(
                ERRCODE_DATA_CORRUPTED,
                format!("litebase_streams: the stored data of event {position} cannot be read"),
            )
            .detail(error.clone()),
            StreamsError::CommitTimesLost { events, after, through } => described(
                ERRCODE_WARNING,
                format!("litebase_streams: the commit time of {events} event(s) was lost before it was recorded"),
            )
            .detail(format!(
                "Their events, at positions after {after} through {through}, carry the time the worker recorded \
                 them instead, an upper bound; streams.commit_times.inexact lists them."
            ))
            .hint(
                "Commit timestamps are kept until VACUUM FREEZE truncates them: keep the worker running \
                 (see streams.status). After a restore, events committed just before the dump was taken lose theirs.",
            ),
            StreamsError::OutOfMemory(what) => {
                described(ERRCODE_OUT_OF_MEMORY, format!("litebase_streams: out of memory for {what}"))
            }
            StreamsError::NotUtf8 => {
                described(ERRCODE_FEATURE_NOT_SUPPORTED, "litebase_streams needs a database with UTF8 encoding").hint(
                    "Event data and notifications are JSON text in UTF-8: create the database with ENCODING 'UTF8'.",
                )
            }
            StreamsError::HorizonStateChanged => described(
                ERRCODE_T_R_SERIALIZATION_FAILURE,
                "litebase_streams: streams.horizon_state was written by another session during a delivery round",
            )
            .hint("Only the worker writes it, except a restore (pg_restore): the round is retried and reads it again."),
            StreamsError::InvalidSubscriptionName { name, reason } => described(
                ERRCODE_INVALID_PARAMETER_VALUE,
                format!("invalid subscription name \"{}\"", name.escape_default()),
            )
            .detail(sentence(reason))
            .hint(format!("Subscription names follow the stream naming rule. {}", name_rule_hint())),
            StreamsError::DuplicateSubscription(name) => {
                described(ERRCODE_DUPLICATE_OBJECT, format!("subscription \"{name}\" already exists"))
            }
            StreamsError::UnknownSubscription(name) => {
                described(ERRCODE_UNDEFINED_OBJECT, format!("subscription \"{name}\" does not exist"))
            }
            StreamsError::NotSubscriptionOwner(name) => {
                described(ERRCODE_INSUFFICIENT_PRIVILEGE, format!("permission denied for subscription \"{name}\""))
                    .hint("Poll, ack, seek or drop it as the role that created it or a member of that role.")
            }
            StreamsError::AmbiguousSubscription { name, owners } => {
                described(ERRCODE_AMBIGUOUS_ALIAS, format!("subscription name \"{name}\" is ambiguous"))
                    .detail(format!("Roles you belong to that own one: {}.", owners.join(", ")))
                    .hint("Names are per owning role: SET ROLE to the owner whose subscription you mean, then call again.")
            }
            StreamsError::SubscriptionNotReadable { subscription, stream } => described(
                ERRCODE_INSUFFICIENT_PRIVILEGE,
                format!("permission denied to read stream \"{stream}\" of subscription \"{subscription}\""),
            )
            .hint(
                "A superuser or the extension's owner grants it: SELECT streams.grant('read', '<pattern>', '<role>'); \
                 the grant must cover the whole pattern.",
            ),
            StreamsError::AckNotPolled { subscription, through, polled_through } => {
                let message = match polled_through {
                    None => format!(
                        "streams.ack: this transaction polled nothing from subscription \"{subscription}\" (through {through})"
                    ),
                    Some(polled) => format!(
                        "streams.ack: position {through} is beyond what this transaction polled from subscription \"{subscription}\" (through {polled})"
                    ),
                };
                described(ERRCODE_INVALID_PARAMETER_VALUE, message)
                    .hint("Ack, in the transaction that polled them, at most the last position streams.poll returned.")
            }
            StreamsError::PollNeedsReadCommitted { long_poll } => described(
                ERRCODE_FEATURE_NOT_SUPPORTED,
                if *long_poll {
                    "streams.poll with a wait needs READ COMMITTED isolation"
                } else {
                    "streams.poll of an unordered subscription needs READ COMMITTED isolation"
                },
            )
            .hint(
                "Poll in a READ COMMITTED transaction (the default isolation level): a snapshot taken at the \
                 transaction's start never shows later events, nor other consumers' acks.",
            ),
            StreamsError::PreparedPoll => described(
                ERRCODE_FEATURE_NOT_SUPPORTED,
                "cannot PREPARE a transaction that holds claims or locks of a litebase_streams subscription",
            )
            .hint(
                "Poll, ack, seek and drop subscriptions in a transaction that commits directly; two-phase commit is \
                 not supported.",
            ),
            StreamsError::TooManyClaims { subscription, chunks } => described(
                ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                format!(
                    "streams.poll: this transaction holds claims on {chunks} chunks, the most one transaction may \
                     (subscription \"{subscription}\")"
                ),
            )
            .hint(
                "Ack what was polled and commit, then poll again: claims are locks, and the lock table is shared \
                 by every session.",
            ),
            StreamsError::DeliveryNotRecorded { worker } => described(
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                if *worker {
                    "streams.poll: the worker could not write down the delivery of these events"
                } else {
                    "streams.poll: no litebase_streams worker runs in this database to write down deliveries"
                },
            )
            .hint(
                "Attempts are counted by the database's worker before events are handed out; see streams.status \
                 and the server log, then poll again.",
            ),
            StreamsError::DeliveryBlocked => described(
                ERRCODE_LOCK_NOT_AVAILABLE,
                "streams.poll: a transaction holds the attempt records of these events (this one, if it nacked or \
                 acked events of this subscription)",
            )
            .hint("A nack or an ack in this transaction holds them until it ends: commit first. Otherwise poll again."),
            StreamsError::NackNotDelivered { subscription, position, reason } => described(
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("streams.nack: event {position} of subscription \"{subscription}\" {reason}"),
            )
            .hint(
                "Nack an event in the transaction that polled it, or after that transaction failed, from the same \
                 session, before it is delivered again.",
            ),
            StreamsError::InvalidEnvelope { argument, reason } => {
                described(ERRCODE_INVALID_PARAMETER_VALUE, format!("invalid {argument}: {reason}"))
            }
            StreamsError::InvalidFilter { argument, reason } => {
                described(ERRCODE_INVALID_PARAMETER_VALUE, format!("invalid {argument}: {reason}")).hint(
                    "types => ARRAY['order.failed', ...] keeps events of those types; filter => '{\"status\": \"failed\"}' \
                     keeps events whose data contains that object (data @> filter).",
                )
            }
            StreamsError::IdempotencyKeyReused { stream, key, position } => described(
                ERRCODE_UNIQUE_VIOLATION,
                format!("idempotency key \"{}\" of stream \"{stream}\" was used for another event", key.escape_default()),
            )
            .detail(format!("The key published the event at position {position}, with other data or envelope."))
            .hint("Use a new idempotency key for a new event; a retry must repeat the original exactly."),
            StreamsError::UnexpectedPrev { stream, expected, actual } => described(
                ERRCODE_T_R_SERIALIZATION_FAILURE,
                format!("stream \"{stream}\" is not at the expected position {expected}"),
            )
            .detail(if *actual == 0 {
                "The stream has no events, counting uncommitted ones.".to_owned()
            } else {
                format!("The newest event of the stream, counting uncommitted ones, is at position {actual}.")
            })
            .hint("Another writer appended first: read the stream again (streams.stream_head) and retry."),
            StreamsError::TextTooLong { argument, limit } => {
                described(ERRCODE_INVALID_PARAMETER_VALUE, format!("{argument} is longer than {limit} bytes"))
            }
            StreamsError::SubscriptionDiffers { name, differs } => described(
                ERRCODE_DUPLICATE_OBJECT,
                format!("subscription \"{name}\" already exists with another {differs}"),
            )
            .hint("if_not_exists => true accepts only an identical subscription: drop it first, or use another name."),
            StreamsError::NotADeadLetter { subscription, position } => described(
                ERRCODE_NO_DATA_FOUND,
                format!("event {position} is not a dead letter of subscription \"{subscription}\""),
            )
            .hint("SELECT * FROM streams.dead_letters lists them."),
            StreamsError::LeaseGone { subscription, lease } => described(
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("lease {lease} of subscription \"{subscription}\" expired or was taken over; nothing was changed"),
            )
            .hint(
                "Its events are delivered again, with the next attempt number, to the next poll. Poll with a longer \
                 lease, or keep it with streams.extend_lease before it expires.",
            ),
            StreamsError::LockReserved(relation) => described(
                ERRCODE_INSUFFICIENT_PRIVILEGE,
                format!("permission denied to lock streams.{relation}: only its owner may lock it"),
            )
            .hint(
                "The extension's relations are locked by its own functions as they need; a role with \
                 pg_write_all_data may write to tables, not hold the log.",
            ),
            StreamsError::KeyNeedsOrdered => described(
                ERRCODE_INVALID_PARAMETER_VALUE,
                "a subscription with a key is ordered per key: ordered => false contradicts it",
            )
            .hint("Leave ordered at its default (true) with key => ..., or drop the key for competing consumers without order."),
            StreamsError::InvalidKeyPath { key, reason } => {
                described(ERRCODE_INVALID_PARAMETER_VALUE, format!("invalid key \"{key}\": {reason}"))
                    .hint("key => '$key' (the event's own key), 'order_id' (a field of data), 'customer.id' (a nested one) or '$stream' (per stream).")
            }
            StreamsError::InvalidOnDeadLetter(value) => described(
                ERRCODE_INVALID_PARAMETER_VALUE,
                format!("on_dead_letter must be 'hold' or 'skip', not \"{value}\""),
            ),
            StreamsError::NeedsOrdered { function, subscription } => described(
                ERRCODE_FEATURE_NOT_SUPPORTED,
                format!("{function}: subscription \"{subscription}\" is not ordered in one sequence"),
            )
            .hint(
                "a lease needs an ordered subscription without a key (ordered => true, the default).",
            ),
            StreamsError::BackoffOrder => {
                described(ERRCODE_INVALID_PARAMETER_VALUE, "backoff_min must not be greater than backoff_max")
            }
            StreamsError::WaitNeedsReadCommitted => described(
                ERRCODE_FEATURE_NOT_SUPPORTED,
                "streams.wait: this transaction's snapshot will never show that event; wait in READ COMMITTED",
            ),
            StreamsError::InvalidWebhookUrl { url, reason } => described(
                ERRCODE_INVALID_PARAMETER_VALUE,
                format!("invalid webhook URL \"{}\"", url.escape_default()),
            )
            .detail(sentence(reason)),
            StreamsError::InvalidWebhookSecret => described(
                ERRCODE_INVALID_PARAMETER_VALUE,
                "invalid webhook secret: it must be whsec_ followed by the base64 of 24 to 64 bytes",
            )
            .hint(
                "Leave secret NULL and create_webhook makes one (32 random bytes), or pass a secret from another \
                 Standard Webhooks sender.",
            ),
            StreamsError::UnknownWebhook(name) => {
                described(ERRCODE_UNDEFINED_OBJECT, format!("webhook \"{name}\" does not exist"))
            }
            StreamsError::WebhookSubscription(name) => described(
                ERRCODE_WRONG_OBJECT_TYPE,
                format!("subscription \"{name}\" belongs to a webhook; its events are delivered by the extension"),
            )
            .hint("Use streams.pause_webhook, streams.resume_webhook or streams.drop_webhook; streams.seek moves it."),
            StreamsError::CaptureNotATable { table, kind } => {
                described(ERRCODE_WRONG_OBJECT_TYPE, format!("\"{table}\" is {kind}, not a table"))
                    .hint("streams.capture captures ordinary and partitioned tables.")
            }
            StreamsError::CaptureUnsupported { table, reason } => {
                described(ERRCODE_FEATURE_NOT_SUPPORTED, format!("cannot capture \"{table}\": {reason}"))
            }
            StreamsError::CaptureWithoutKey(table) => described(
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("cannot capture \"{table}\": it has no primary key"),
            )
            .detail("Each captured change names its row by the primary key.")
            .hint(format!("Add a primary key, or run ALTER TABLE {table} REPLICA IDENTITY FULL to capture whole rows.")),
            StreamsError::AlreadyCaptured(table) => {
                described(ERRCODE_DUPLICATE_OBJECT, format!("table \"{table}\" is already captured"))
                    .hint("streams.uncapture it first to capture it into another stream.")
            }
            StreamsError::NotCaptured(table) => {
                described(ERRCODE_UNDEFINED_OBJECT, format!("table \"{table}\" is not captured"))
            }
            StreamsError::NotTableOwner(table) => {
                described(ERRCODE_INSUFFICIENT_PRIVILEGE, format!("must be owner of table \"{table}\""))
            }
            StreamsError::InvalidExclude { table, column, reason } => described(
                ERRCODE_INVALID_PARAMETER_VALUE,
                format!("cannot exclude column \"{column}\" of \"{table}\": {reason}"),
            ),
            StreamsError::CaptureMisused(how) => described(
                ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED,
                format!("streams._capture() must be {how}"),
            )
            .hint("Capture a table with streams.capture."),
            StreamsError::SnapshotNeedsRepeatableRead => described(
                ERRCODE_INVALID_TRANSACTION_STATE,
                "streams.snapshot() must run in a REPEATABLE READ or SERIALIZABLE transaction",
            )
            .detail("Only a transaction snapshot holds still while the tables are copied.")
            .hint("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT * FROM streams.snapshot(); then copy."),
            StreamsError::SnapshotAfterWrites => described(
                ERRCODE_ACTIVE_SQL_TRANSACTION,
                "streams.snapshot() must come before the transaction changes anything",
            )
            .detail("The transaction's own changes and events would be in what it reads but not in what others see.")
            .hint("Call it first, in a new REPEATABLE READ transaction."),
            StreamsError::ImmutableEvents { operation, table } => described(
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("streams: stored events are immutable; {operation} on {table} is not allowed"),
            )
            .hint("Publish a new event that corrects or supersedes the old one; streams.redact erases an event's data."),
            StreamsError::CopyOfPartitionedLog => described(
                ERRCODE_WRONG_OBJECT_TYPE,
                "streams: COPY streams.event_log TO is not supported: the log is partitioned".to_owned(),
            )
            .hint("Copy a query: COPY (SELECT * FROM streams.events) TO ..., or of streams.replay(...)."),
            StreamsError::NoSuchEvent(position) => {
                described(ERRCODE_UNDEFINED_OBJECT, format!("no final event at position {position} that you may redact"))
                    .hint("Only final events (at or below streams.horizon()) of streams granted to you with 'redact' can be redacted.")
            }
            StreamsError::RedactionNeedsSelection => described(
                ERRCODE_INVALID_PARAMETER_VALUE,
                "streams.redact_matching needs a filter or a key",
            )
            .hint("Pass filter => '{}' to redact every event of the stream."),
        }
    }

    pub fn sqlstate(&self) -> PgSqlErrorCode {
        self.describe().sqlstate
    }

    fn report(&self) -> ErrorReport {
        let Described { sqlstate, message, detail, hint } = self.describe();
        let mut report = ErrorReport::new(sqlstate, message, function_name!());
        if let Some(detail) = detail {
            report = report.set_detail(detail);
        }
        if let Some(hint) = hint {
            report = report.set_hint(hint);
        }
        report
    }

    /// Raise this error as a PostgreSQL ERROR. Does not return.
    pub fn raise(self) -> ! {
        self.report().report(PgLogLevel::ERROR);
        unreachable!("an ERROR report does not return")
    }

    /// Log this as a WARNING and go on.
    pub fn warn(self) {
        self.report().report(PgLogLevel::WARNING);
    }
}

impl fmt::Display for StreamsError {
    /// The message (errmsg) alone.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe().message)
    }
}

/// The one conversion of the extension's own SPI failures: what it was
/// doing, raised as [`StreamsError::Spi`] (XX000) with SPI's answer as the
/// detail.
pub trait SpiContext<T> {
    fn context(self, doing: &'static str) -> T;
}

impl<T, E: fmt::Display> SpiContext<T> for Result<T, E> {
    fn context(self, doing: &'static str) -> T {
        self.unwrap_or_else(|e| StreamsError::Spi { doing, error: e.to_string() }.raise())
    }
}

/// `?`-friendly: unwrap a result or raise its error.
pub trait OrRaise<T> {
    fn or_raise(self) -> T;
}

impl<T, E: Into<StreamsError>> OrRaise<T> for Result<T, E> {
    fn or_raise(self) -> T {
        self.unwrap_or_else(|e| e.into().raise())
    }
}

impl From<FilterError> for StreamsError {
    fn from(FilterError { argument, reason }: FilterError) -> StreamsError {
        StreamsError::InvalidFilter { argument, reason }
    }
}

impl From<NameError> for StreamsError {
    fn from(NameError { name, reason }: NameError) -> StreamsError {
        StreamsError::InvalidStreamName { name, reason }
    }
}
