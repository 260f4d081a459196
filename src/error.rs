//! The one error type of litebase_streams, and the one place where each kind of
//! failure gets its SQLSTATE, message and hint.
//!
//! Functions return `Result<_, StreamsError>`; `raise` turns an error into a
//! PostgreSQL ERROR, so a user always learns about bad input through a SQLSTATE,
//! never through a panic.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{function_name, PgLogLevel, PgSqlErrorCode};
use std::fmt;

use litebase_streams_core::names::{NameError, STREAM_NAME_RULE};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamsError {
    /// A stream name (or pattern) that breaks the naming rule.
    InvalidStreamName { name: String, reason: &'static str },
    /// A NULL where a value is required; names the argument.
    NullArgument(&'static str),
    /// An argument outside its allowed range; the message says which.
    InvalidArgument(String),
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
    /// A webhook URL that is malformed, not http(s), or names a host the
    /// address policy refuses.
    InvalidWebhookUrl { url: String, reason: String },
    /// A webhook secret that is not `whsec_` and base64 of 24 to 64 bytes.
    InvalidWebhookSecret,
    /// No webhook of that name.
    UnknownWebhook(String),
    /// poll, ack or drop_subscription of a webhook's subscription.
    WebhookSubscription(String),
}

impl fmt::Display for StreamsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamsError::InvalidStreamName { name, reason } => {
                write!(f, "invalid stream name \"{}\": {reason}; {STREAM_NAME_RULE}", name.escape_default())
            }
            StreamsError::NullArgument(arg) => write!(f, "{arg} must not be null"),
            StreamsError::InvalidArgument(msg) => f.write_str(msg),
            StreamsError::NotPreloaded { .. } => {
                f.write_str("litebase_streams needs shared_preload_libraries and track_commit_timestamp")
            }
            StreamsError::NoPublisherSlot(procno) => {
                write!(f, "backend slot {procno} is outside litebase_streams' shared slot table")
            }
            StreamsError::PreparedPublish => {
                f.write_str("cannot PREPARE a transaction that published events with litebase_streams")
            }
            StreamsError::PermissionDenied { privilege, stream } => {
                write!(f, "permission denied to {privilege} stream \"{stream}\"")
            }
            StreamsError::EventTooLarge { size, limit } => {
                write!(f, "event data of {size} bytes exceeds litebase_streams.max_event_size ({limit} bytes)")
            }
            StreamsError::NotUtf8 => f.write_str("litebase_streams needs a database with UTF8 encoding"),
            StreamsError::Spi { doing, .. } => write!(f, "litebase_streams: {doing} failed"),
            StreamsError::MissingObject(name) => write!(f, "litebase_streams: {name} is missing"),
            StreamsError::CorruptEvent { position, .. } => {
                write!(f, "litebase_streams: the stored data of event {position} cannot be read")
            }
            StreamsError::InvalidSubscriptionName { name, reason } => {
                write!(f, "invalid subscription name \"{}\": {reason}; {STREAM_NAME_RULE}", name.escape_default())
            }
            StreamsError::DuplicateSubscription(name) => write!(f, "subscription \"{name}\" already exists"),
            StreamsError::UnknownSubscription(name) => write!(f, "subscription \"{name}\" does not exist"),
            StreamsError::PositionBelowHorizon { position, horizon } => write!(
                f,
                "streams.position_seq handed out position {position}, at or below the horizon {horizon}"
            ),
            StreamsError::AmbiguousSubscription { name, .. } => write!(f, "subscription name \"{name}\" is ambiguous"),
            StreamsError::NotSubscriptionOwner(name) => {
                write!(f, "permission denied for subscription \"{name}\"")
            }
            StreamsError::SubscriptionNotReadable { subscription, stream } => write!(
                f,
                "permission denied to read stream \"{stream}\" of subscription \"{subscription}\""
            ),
            StreamsError::AckNotPolled { subscription, through, polled_through: None } => write!(
                f,
                "streams.ack: this transaction polled nothing from subscription \"{subscription}\" (through {through})"
            ),
            StreamsError::AckNotPolled { subscription, through, polled_through: Some(polled) } => write!(
                f,
                "streams.ack: position {through} is beyond what this transaction polled from subscription \"{subscription}\" (through {polled})"
            ),
            StreamsError::PollNeedsReadCommitted { long_poll: false } => {
                f.write_str("streams.poll of an unordered subscription needs READ COMMITTED isolation")
            }
            StreamsError::PollNeedsReadCommitted { long_poll: true } => {
                f.write_str("streams.poll with a wait needs READ COMMITTED isolation")
            }
            StreamsError::TooManyClaims { subscription, chunks } => write!(
                f,
                "streams.poll: this transaction holds claims on {chunks} chunks, the most one transaction may \
                 (subscription \"{subscription}\")"
            ),
            StreamsError::WaitNeedsReadCommitted => f.write_str(
                "streams.wait: this transaction's snapshot will never show that event; wait in READ COMMITTED",
            ),
            StreamsError::PreparedPoll => {
                f.write_str("cannot PREPARE a transaction that holds claims or locks of a litebase_streams subscription")
            }
            StreamsError::HorizonStateChanged => f.write_str(
                "litebase_streams: streams.horizon_state was written by another session during a delivery round",
            ),
            StreamsError::InvalidWebhookUrl { url, reason } => {
                write!(f, "invalid webhook URL \"{}\": {reason}", url.escape_default())
            }
            StreamsError::InvalidWebhookSecret => {
                f.write_str("invalid webhook secret: it must be whsec_ followed by the base64 of 24 to 64 bytes")
            }
            StreamsError::UnknownWebhook(name) => write!(f, "webhook \"{name}\" does not exist"),
            StreamsError::WebhookSubscription(name) => write!(
                f,
                "subscription \"{name}\" belongs to a webhook; its events are delivered by the extension"
            ),
            StreamsError::CommitTimesLost { events, .. } => write!(
                f,
                "litebase_streams: the commit time of {events} event(s) was lost before it was recorded"
            ),
            StreamsError::OutOfMemory(what) => write!(f, "litebase_streams: out of memory for {what}"),
        }
    }
}

impl StreamsError {
    pub fn sqlstate(&self) -> PgSqlErrorCode {
        match self {
            StreamsError::InvalidStreamName { .. } | StreamsError::InvalidArgument(_) => {
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE
            }
            StreamsError::NullArgument(_) => PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
            StreamsError::NotPreloaded { .. } => PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            StreamsError::NoPublisherSlot(_) | StreamsError::Spi { .. } => PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            StreamsError::MissingObject(_) => PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            StreamsError::CorruptEvent { .. } => PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
            StreamsError::HorizonStateChanged => PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
            StreamsError::TooManyClaims { .. } => PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            StreamsError::InvalidSubscriptionName { .. } | StreamsError::AckNotPolled { .. } => {
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE
            }
            StreamsError::DuplicateSubscription(_) => PgSqlErrorCode::ERRCODE_DUPLICATE_OBJECT,
            StreamsError::UnknownSubscription(_) => PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            StreamsError::AmbiguousSubscription { .. } => PgSqlErrorCode::ERRCODE_AMBIGUOUS_ALIAS,
            StreamsError::PositionBelowHorizon { .. } => PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            StreamsError::NotSubscriptionOwner(_) | StreamsError::SubscriptionNotReadable { .. } => {
                PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE
            }
            StreamsError::PollNeedsReadCommitted { .. }
            | StreamsError::PreparedPoll
            | StreamsError::WaitNeedsReadCommitted => PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            StreamsError::CommitTimesLost { .. } => PgSqlErrorCode::ERRCODE_WARNING,
            StreamsError::OutOfMemory(_) => PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
            StreamsError::PreparedPublish => PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            StreamsError::PermissionDenied { .. } => PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            StreamsError::NotUtf8 => PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            StreamsError::EventTooLarge { .. } => PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            StreamsError::InvalidWebhookUrl { .. } | StreamsError::InvalidWebhookSecret => {
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE
            }
            StreamsError::UnknownWebhook(_) => PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            StreamsError::WebhookSubscription(_) => PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            StreamsError::NotPreloaded { preloaded, commit_timestamps } => {
                let mut missing = Vec::new();
                if !preloaded {
                    missing.push("shared_preload_libraries = 'litebase_streams'");
                }
                if !commit_timestamps {
                    missing.push("track_commit_timestamp = on");
                }
                Some(format!(
                    "Add {} to postgresql.conf (keep any libraries already listed in \
                     shared_preload_libraries), then restart the server.",
                    missing.join(" and ")
                ))
            }
            StreamsError::PreparedPublish => Some(
                "Publish from a transaction that commits directly; two-phase commit is not supported."
                    .into(),
            ),
            StreamsError::NoPublisherSlot(_) => {
                Some("Restart the server so the slot table is sized for max_connections.".into())
            }
            StreamsError::PermissionDenied { privilege, .. } => Some(format!(
                "A superuser or the extension's owner grants it: SELECT streams.grant('{privilege}', '<stream or prefix.*>', '<role>');"
            )),
            StreamsError::NotUtf8 => Some(
                "Event data and notifications are JSON text in UTF-8: create the database with ENCODING 'UTF8'.".into(),
            ),
            StreamsError::EventTooLarge { .. } => Some(
                "Store large payloads elsewhere and publish a reference, or have a superuser raise the setting.".into(),
            ),
            StreamsError::MissingObject(_) => Some(
                "Objects of the extension must not be dropped by hand: recreate them with \
                 DROP EXTENSION litebase_streams and CREATE EXTENSION litebase_streams (this drops the log; dump it first)."
                    .into(),
            ),
            StreamsError::CommitTimesLost { .. } => Some(
                "Commit timestamps are kept until VACUUM FREEZE truncates them: keep the worker running \
                 (see streams.status). After a restore, events committed just before the dump was taken lose theirs."
                    .into(),
            ),
            StreamsError::NotSubscriptionOwner(_) => Some(
                "Poll, ack, seek or drop it as the role that created it or a member of that role.".into(),
            ),
            StreamsError::PositionBelowHorizon { horizon, .. } => Some(format!(
                "The sequence was moved back by hand; nothing was published. A superuser moves it forward: \
                 SELECT setval('streams.position_seq', GREATEST({horizon}, streams._newest_position()));"
            )),
            StreamsError::AmbiguousSubscription { .. } => Some(
                "Names are per owning role: SET ROLE to the owner whose subscription you mean, then call again."
                    .into(),
            ),
            StreamsError::SubscriptionNotReadable { .. } => Some(
                "A superuser or the extension's owner grants it: SELECT streams.grant('read', '<pattern>', '<role>'); \
                 the grant must cover the whole pattern."
                    .into(),
            ),
            StreamsError::AckNotPolled { .. } => Some(
                "Ack, in the transaction that polled them, at most the last position streams.poll returned.".into(),
            ),
            StreamsError::PollNeedsReadCommitted { .. } => Some(
                "Poll in a READ COMMITTED transaction (the default isolation level): a snapshot taken at the \
                 transaction's start never shows later events, nor other consumers' acks."
                    .into(),
            ),
            StreamsError::TooManyClaims { .. } => Some(
                "Ack what was polled and commit, then poll again: claims are locks, and the lock table is shared \
                 by every session."
                    .into(),
            ),
            StreamsError::PreparedPoll => Some(
                "Poll, ack, seek and drop subscriptions in a transaction that commits directly; two-phase commit is \
                 not supported."
                    .into(),
            ),
            StreamsError::InvalidWebhookSecret => Some(
                "Leave secret NULL and create_webhook makes one (32 random bytes), or pass a secret from another \
                 Standard Webhooks sender."
                    .into(),
            ),
            StreamsError::WebhookSubscription(_) => Some(
                "Use streams.pause_webhook, streams.resume_webhook or streams.drop_webhook; streams.seek moves it."
                    .into(),
            ),
            StreamsError::HorizonStateChanged => Some(
                "Only the worker writes it, except a restore (pg_restore): the round is retried and reads it again."
                    .into(),
            ),
            _ => None,
        }
    }

    fn detail(&self) -> Option<String> {
        match self {
            StreamsError::Spi { error, .. } | StreamsError::CorruptEvent { error, .. } => Some(error.clone()),
            StreamsError::AmbiguousSubscription { owners, .. } => {
                Some(format!("Roles you belong to that own one: {}.", owners.join(", ")))
            }
            StreamsError::CommitTimesLost { after, through, .. } => Some(format!(
                "Their events, at positions after {after} through {through}, carry the time the worker recorded \
                 them instead, an upper bound; streams.commit_times.inexact lists them."
            )),
            _ => None,
        }
    }

    fn report(&self) -> ErrorReport {
        let mut report = ErrorReport::new(self.sqlstate(), self.to_string(), function_name!());
        if let Some(detail) = self.detail() {
            report = report.set_detail(detail);
        }
        if let Some(hint) = self.hint() {
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

/// `?`-friendly: unwrap a result or raise its error.
pub trait OrRaise<T> {
    fn or_raise(self) -> T;
}

impl<T, E: Into<StreamsError>> OrRaise<T> for Result<T, E> {
    fn or_raise(self) -> T {
        self.unwrap_or_else(|e| e.into().raise())
    }
}

impl From<NameError> for StreamsError {
    fn from(NameError { name, reason }: NameError) -> StreamsError {
        StreamsError::InvalidStreamName { name, reason }
    }
}
