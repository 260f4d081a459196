//! The one error type of the library, and the one place a SQLSTATE becomes
//! a variant (the README's "Errors" table).
//!
//! Every error the database raises keeps its [`tokio_postgres::Error`]
//! (message, detail and hint: [`Error::db_error`]); errors the library finds
//! before asking the server carry the same SQLSTATE the server would have
//! raised ([`Error::sqlstate`]).

use std::fmt;

use litebase_streams_core::filters::FilterError;
use litebase_streams_core::names::NameError;

/// Everything that can go wrong in this library.
///
/// The variants named after a SQLSTATE hold the server's error as it came;
/// [`Error::Db`] holds every other one (a lost connection included).
///
/// ```
/// use litebase_streams_client::Error;
///
/// fn what_to_do(error: &Error) -> &'static str {
///     match error {
///         Error::ExpectedVersion(_) => "read the stream again and retry",
///         Error::IdempotencyConflict(_) => "a retry must repeat the original exactly",
///         Error::LogChanged { .. } => "the log was re-created: start again from position 0",
///         e if e.is_connection_error() => "reconnect",
///         _ => "give up",
///     }
/// }
/// # let _ = what_to_do;
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// 40001: `expected_prev` did not match the stream's newest event (the
    /// detail names it), or another serialization failure: retry the
    /// transaction.
    ExpectedVersion(tokio_postgres::Error),
    /// 23505: an idempotency key remembered for other data or envelope.
    IdempotencyConflict(tokio_postgres::Error),
    /// 42501: the role lacks the `read` or `publish` privilege (`streams.grant`).
    PermissionDenied(tokio_postgres::Error),
    /// 22023: a bad stream name or pattern, envelope, idempotency key, filter
    /// or argument out of range; nothing was written.
    InvalidArgument(tokio_postgres::Error),
    /// 22004: a required argument was NULL.
    NullArgument(tokio_postgres::Error),
    /// 42704: an unknown subscription or webhook.
    NotFound(tokio_postgres::Error),
    /// 54000: `data` larger than `litebase_streams.max_event_size`, or a
    /// transaction holding too many claims.
    TooLarge(tokio_postgres::Error),
    /// 55000: an object not in the state the call needs (a nack of an event
    /// that is not the caller's, an expired lease, no worker running).
    WrongState(tokio_postgres::Error),
    /// 0A000: not supported (`PREPARE TRANSACTION` after publish or poll, a
    /// lease of an unordered subscription, a long poll under REPEATABLE READ).
    NotSupported(tokio_postgres::Error),
    /// 25006: publishing on a standby.
    ReadOnly(tokio_postgres::Error),
    /// 42710: a subscription (or capture) of that name exists already.
    AlreadyExists(tokio_postgres::Error),
    /// Any other error of the server or the connection to it.
    Db(tokio_postgres::Error),
    /// The connection closed without saying why.
    ConnectionLost,
    /// A stream name or pattern that breaks the naming rule, found before
    /// asking the server (SQLSTATE 22023, as the server would say).
    InvalidName(NameError),
    /// `types` or `filter` that break their rules, found before asking the
    /// server (SQLSTATE 22023).
    InvalidFilter(FilterError),
    /// The log the cursor belongs to is gone: the extension was re-created
    /// or the database restored, and positions started over. The cursor is
    /// of no use in the new log; start again from position 0 of `new`
    /// ([`Cursor::start_of`](crate::Cursor::start_of)) once whatever was
    /// built from the old log is dealt with.
    LogChanged {
        /// The log id of the cursor given.
        old: String,
        /// The database's log id now.
        new: String,
    },
    /// The server sent something the library cannot read (a row or payload
    /// of another shape; an extension older than this library expects).
    Decode(String),
}

impl Error {
    /// The SQLSTATE of the error: the server's, or the one the server
    /// would have raised for an argument checked before asking it; `None`
    /// for [`Error::LogChanged`], [`Error::Decode`] and errors without one
    /// (a lost connection).
    ///
    /// ```
    /// # use litebase_streams_client::Error;
    /// let e = Error::LogChanged { old: "a".into(), new: "b".into() };
    /// assert_eq!(e.sqlstate(), None);
    /// ```
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            Error::InvalidName(_) | Error::InvalidFilter(_) => Some("22023"),
            Error::LogChanged { .. } | Error::Decode(_) | Error::ConnectionLost => None,
            other => other.postgres().and_then(|e| e.code()).map(|code| code.code()),
        }
    }

    /// The server's error report (message, detail, hint), when there is one.
    pub fn db_error(&self) -> Option<&tokio_postgres::error::DbError> {
        self.postgres().and_then(|e| e.as_db_error())
    }

    /// The tokio-postgres error underneath, when there is one.
    pub fn postgres(&self) -> Option<&tokio_postgres::Error> {
        match self {
            Error::ExpectedVersion(e)
            | Error::IdempotencyConflict(e)
            | Error::PermissionDenied(e)
            | Error::InvalidArgument(e)
            | Error::NullArgument(e)
            | Error::NotFound(e)
            | Error::TooLarge(e)
            | Error::WrongState(e)
            | Error::NotSupported(e)
            | Error::ReadOnly(e)
            | Error::AlreadyExists(e)
            | Error::Db(e) => Some(e),
            _ => None,
        }
    }

    /// Whether the error is the loss of the connection (or of the server):
    /// an I/O error, a closed connection, SQLSTATE class 08, the server
    /// shutting down or terminating the session (57P01 to 57P03), too many
    /// connections (53300). `subscribe` and `consume` reconnect after these;
    /// nothing of an unfinished transaction took effect.
    pub fn is_connection_error(&self) -> bool {
        if matches!(self, Error::ConnectionLost) {
            return true;
        }
        let Some(e) = self.postgres() else { return false };
        if e.is_closed() {
            return true;
        }
        if let Some(db) = e.as_db_error() {
            let code = db.code().code();
            return code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "53300");
        }
        // Not from the server: the socket, connecting, a timeout.
        std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
            || e.to_string().starts_with("error connecting")
            || e.to_string().starts_with("timeout")
    }
}

impl From<tokio_postgres::Error> for Error {
    fn from(e: tokio_postgres::Error) -> Error {
        let Some(code) = e.code().map(|c| c.code().to_owned()) else { return Error::Db(e) };
        match code.as_str() {
            "40001" => Error::ExpectedVersion(e),
            "23505" => Error::IdempotencyConflict(e),
            "42501" => Error::PermissionDenied(e),
            "22023" => Error::InvalidArgument(e),
            "22004" => Error::NullArgument(e),
            "42704" => Error::NotFound(e),
            "54000" => Error::TooLarge(e),
            "55000" => Error::WrongState(e),
            "0A000" => Error::NotSupported(e),
            "25006" => Error::ReadOnly(e),
            "42710" => Error::AlreadyExists(e),
            _ => Error::Db(e),
        }
    }
}

impl From<NameError> for Error {
    fn from(e: NameError) -> Error {
        Error::InvalidName(e)
    }
}

impl From<FilterError> for Error {
    fn from(e: FilterError) -> Error {
        Error::InvalidFilter(e)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidName(e) => write!(f, "invalid stream name or pattern {:?}: {}", e.name, e.reason),
            Error::InvalidFilter(e) => write!(f, "invalid {}: {}", e.argument, e.reason),
            Error::LogChanged { old, new } => {
                write!(f, "the log changed (cursor of log {old}, the database has log {new}): positions started over")
            }
            Error::Decode(what) => write!(f, "cannot read what the server sent: {what}"),
            Error::ConnectionLost => f.write_str("the connection to the server closed"),
            other => {
                let e = other.postgres().expect("the other variants hold a tokio-postgres error");
                match e.as_db_error() {
                    Some(db) => {
                        write!(f, "{} ({})", db.message(), db.code().code())?;
                        if let Some(detail) = db.detail() {
                            write!(f, ": {detail}")?;
                        }
                        Ok(())
                    }
                    None => write!(f, "{e}"),
                }
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.postgres().map(|e| e as _)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_side_checks_carry_the_servers_sqlstate() {
        let name = litebase_streams_core::names::parse_stream_selector("order.*x").unwrap_err();
        let e = Error::from(name);
        assert_eq!(e.sqlstate(), Some("22023"));
        assert!(e.to_string().contains("order.*x"));
        assert!(!e.is_connection_error());
        let changed = Error::LogChanged { old: "a".into(), new: "b".into() };
        assert_eq!(changed.sqlstate(), None);
        assert!(changed.to_string().contains("started over"));
    }
}
