//! The envelope arguments of `streams.publish` and `publish_batch`: an
//! event's `type`, `key` and `headers`, checked against the rules of
//! `litebase_streams_core::envelope` (22023) and passed on as the datums the
//! row stores; an absent one is a null column, which costs the row nothing
//! (its null bitmap fits the tuple header's padding).

use pgrx::pg_sys;

use crate::error::{OrRaise, StreamsError};
use litebase_streams_core::envelope::{self, EnvelopeError, HeaderValue};

/// The envelope of one publish: each value's datum, or `None` for null.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Envelope {
    pub type_: Option<pg_sys::Datum>,
    pub key: Option<pg_sys::Datum>,
    pub headers: Option<pg_sys::Datum>,
}

impl Envelope {
    /// Read and check arguments `first` (type), `first + 1` (key) and
    /// `first + 2` (headers) of the call; an empty headers object counts as
    /// none.
    ///
    /// # Safety
    /// SAFETY: `fcinfo` is a valid call whose arguments `first..first + 3` are text, text and
    /// jsonb (the SQL declaration says so).
    pub unsafe fn from_args(fcinfo: pg_sys::FunctionCallInfo, first: usize) -> Envelope {
        let text = |n: usize, check: fn(&str) -> Result<(), EnvelopeError>| {
            if pgrx::fcinfo::pg_arg_is_null(fcinfo, n) {
                return None;
            }
            let value = pgrx::fcinfo::pg_getarg::<&str>(fcinfo, n).unwrap_or_default();
            check(value).map_err(invalid).or_raise();
            Some(pgrx::fcinfo::pg_getarg_datum_raw(fcinfo, n))
        };
        let type_ = text(first, envelope::check_type);
        let key = text(first + 1, envelope::check_key);
        let headers = if pgrx::fcinfo::pg_arg_is_null(fcinfo, first + 2) {
            None
        } else {
            checked_headers(pgrx::fcinfo::pg_getarg_datum_raw(fcinfo, first + 2))
        };
        Envelope { type_, key, headers }
    }

    /// The three datums and their null flags, in column order.
    pub fn columns(&self) -> [Option<pg_sys::Datum>; 3] {
        [self.type_, self.key, self.headers]
    }
}

pub(crate) fn invalid(error: EnvelopeError) -> StreamsError {
    StreamsError::InvalidEnvelope { argument: error.argument, reason: error.reason }
}

/// A headers argument: a JSON object of at most 64 string values within
/// 8 kB, or 22023. `None` for `{}`. Walks the stored jsonb's top level
/// without converting it to text.
///
/// # Safety
/// SAFETY: `datum` is a non-null jsonb datum (maybe toasted: detoasted here, in the current
/// memory context, which the returned datum then points into).
unsafe fn checked_headers(datum: pg_sys::Datum) -> Option<pg_sys::Datum> {
    let jsonb = pg_sys::pg_detoast_datum(datum.cast_mut_ptr()) as *mut pg_sys::Jsonb;
    let header = (*jsonb).root.header;
    if header & pg_sys::JB_FOBJECT == 0 {
        let what = if header & pg_sys::JB_FSCALAR != 0 { "a scalar" } else { "an array" };
        StreamsError::InvalidEnvelope {
            argument: "headers",
            reason: format!("headers is {what}: it must be a JSON object of string values"),
        }
        .raise();
    }
    let count = (header & pg_sys::JB_CMASK) as usize;
    if count == 0 {
        return None;
    }
    let stored = pgrx::varsize_any(jsonb as *const pg_sys::varlena);
    envelope::check_headers_size(count, stored).map_err(invalid).or_raise();
    let mut iterator = pg_sys::JsonbIteratorInit(&mut (*jsonb).root);
    let mut value: pg_sys::JsonbValue = std::mem::zeroed();
    let mut name = String::new();
    loop {
        match pg_sys::JsonbIteratorNext(&mut iterator, &mut value, true) {
            pg_sys::JsonbIteratorToken::WJB_DONE => break,
            pg_sys::JsonbIteratorToken::WJB_KEY => name = jsonb_string(&value).to_owned(),
            pg_sys::JsonbIteratorToken::WJB_VALUE => {
                let kind = match value.type_ {
                    pg_sys::jbvType::jbvString => HeaderValue::String,
                    pg_sys::jbvType::jbvNull => HeaderValue::Other("null"),
                    pg_sys::jbvType::jbvNumeric => HeaderValue::Other("a number"),
                    pg_sys::jbvType::jbvBool => HeaderValue::Other("a boolean"),
                    _ => HeaderValue::Other("an array or object"),
                };
                envelope::check_header(&name, kind).map_err(invalid).or_raise();
            }
            _ => {}
        }
    }
    Some(pg_sys::Datum::from(jsonb))
}

/// The text of a jsonb string value (UTF-8: the database encoding is).
///
/// # Safety
/// SAFETY: `value` is a jbvString the iterator returned, pointing into the jsonb it walks.
unsafe fn jsonb_string(value: &pg_sys::JsonbValue) -> &str {
    let string = value.val.string;
    let bytes = std::slice::from_raw_parts(string.val as *const u8, string.len.max(0) as usize);
    std::str::from_utf8(bytes).unwrap_or("?")
}
