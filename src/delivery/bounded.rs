//! Reading an event's stored values for a notification payload, never
//! more than a payload can carry: a value whose text cannot fit is not read
//! at all (its size comes from the stored datum's header, without
//! detoasting), so the worker's memory does not grow with event size.

use std::ffi::CStr;

use litebase_streams_core::payload::{MAX_DATA_TEXT_BYTES, MAX_PAYLOAD_BYTES};
use pgrx::prelude::*;
use pgrx::spi::{SpiResult, SpiTupleTable};

/// Stored data larger than this (uncompressed jsonb bytes) is never read:
/// its JSON text cannot fit a notification payload (jsonb's binary form is
/// at most a few times larger than its text).
const MAX_DATA_READ_BYTES: usize = 8 * MAX_DATA_TEXT_BYTES;

/// An event's envelope as its payload carries it (see
/// `litebase_streams_core::payload::Event`).
#[derive(Default)]
pub(super) struct Envelope {
    pub(super) type_: Option<String>,
    pub(super) key: Option<String>,
    pub(super) headers: Option<String>,
    /// A value too large to fit any payload was left unread (no publish
    /// lets one through; a row written around it can hold one): the
    /// payload goes without data, `"truncated": true`, so the listener
    /// fetches the event.
    pub(super) unread: bool,
}

/// The envelope of the current row of `rows`, columns `first` (type),
/// `first + 1` (key) and `first + 2` (headers, jsonb); a private stream's
/// key and headers are not read at all (its payload never carries them).
pub(super) fn read_envelope(rows: &SpiTupleTable<'_>, first: usize, private: bool) -> SpiResult<Envelope> {
    let mut envelope = Envelope::default();
    let mut read = |ordinal: usize, as_text: fn(pg_sys::Datum) -> Option<String>| -> SpiResult<Option<String>> {
        let Some(datum) = rows.get_datum_by_ordinal(ordinal)? else { return Ok(None) };
        let text = as_text(datum);
        envelope.unread |= text.is_none();
        Ok(text)
    };
    let type_ = read(first, text_within_payload)?;
    let (key, headers) =
        if private { (None, None) } else { (read(first + 1, text_within_payload)?, read(first + 2, jsonb_text)?) };
    Ok(Envelope { type_, key, headers, ..envelope })
}

/// The contents of a text datum, or `None` without reading it when it is
/// longer than a payload.
fn text_within_payload(datum: pg_sys::Datum) -> Option<String> {
    // SAFETY: `datum` is a non-null text datum of the current row, valid for
    // the round's transaction. The size comes from its header without
    // detoasting; text_to_cstring's copy is palloc'd and freed here (an
    // allocation failure is an ERROR).
    unsafe {
        if pg_sys::toast_raw_datum_size(datum) > MAX_PAYLOAD_BYTES + pg_sys::VARHDRSZ {
            return None;
        }
        let text = pg_sys::text_to_cstring(datum.cast_mut_ptr());
        let owned = CStr::from_ptr(text).to_str().ok().map(str::to_owned);
        pg_sys::pfree(text.cast());
        owned
    }
}

/// The JSON text of a jsonb datum, or `None` without reading it when it is
/// too large to fit a notification anyway.
pub(super) fn jsonb_text(datum: pg_sys::Datum) -> Option<String> {
    // SAFETY: `datum` is a non-null jsonb datum of the current row, valid for
    // the round's transaction. The size comes from its header without
    // detoasting; the detoasted copy and the text are palloc'd in the SPI
    // memory context and freed here (an allocation failure is an ERROR).
    unsafe {
        if pg_sys::toast_raw_datum_size(datum) > MAX_DATA_READ_BYTES {
            return None;
        }
        let raw = datum.cast_mut_ptr::<pg_sys::varlena>();
        let detoasted = pg_sys::pg_detoast_datum(raw);
        let jsonb = detoasted as *mut pg_sys::Jsonb;
        if text_longer_than(jsonb, MAX_DATA_TEXT_BYTES) {
            if detoasted != raw {
                pg_sys::pfree(detoasted.cast());
            }
            return None;
        }
        let text = pg_sys::JsonbToCString(
            std::ptr::null_mut(),
            &raw mut (*jsonb).root,
            pgrx::varlena::varsize_any(detoasted) as i32,
        );
        let owned = CStr::from_ptr(text).to_str().ok().map(str::to_owned);
        pg_sys::pfree(text.cast());
        if detoasted != raw {
            pg_sys::pfree(detoasted.cast());
        }
        owned
    }
}

/// Whether the JSON text of `jsonb` is longer than `limit` bytes, found
/// without writing it: a few bytes of stored jsonb can print as a huge text
/// (a numeric like 1e131071 is 16 bytes stored and 131,072 digits printed),
/// so the stored size alone does not bound what `JsonbToCString` allocates.
/// Sums the length of every key and scalar (printing at most one numeric
/// beyond the limit) and stops as soon as the sum passes `limit`.
///
/// # Safety
/// SAFETY: `jsonb` points to a detoasted jsonb value valid for the call; the
/// iterator and printed numerics are palloc'd (an ERROR, never an abort).
unsafe fn text_longer_than(jsonb: *mut pg_sys::Jsonb, limit: usize) -> bool {
    use pg_sys::JsonbIteratorToken::*;
    let mut iterator = pg_sys::JsonbIteratorInit(&raw mut (*jsonb).root);
    let mut value: pg_sys::JsonbValue = std::mem::zeroed();
    let mut length = 0usize;
    loop {
        let token = pg_sys::JsonbIteratorNext(&mut iterator, &mut value, false);
        length += match token {
            WJB_DONE => return false,
            WJB_KEY | WJB_VALUE | WJB_ELEM => scalar_text_length(&value) + 2,
            _ => 1,
        };
        if length > limit {
            return true;
        }
    }
}

/// The printed length of a scalar (a lower bound for strings, which may
/// grow by escaping; exact for numerics).
///
/// # Safety
/// SAFETY: `value` was filled by JsonbIteratorNext for a scalar token, so the
/// union member matching `type_` is the one set.
unsafe fn scalar_text_length(value: &pg_sys::JsonbValue) -> usize {
    match value.type_ {
        pg_sys::jbvType::jbvString => value.val.string.len.max(0) as usize,
        pg_sys::jbvType::jbvNumeric => {
            let Some(text) = pgrx::fcinfo::direct_function_call_as_datum(
                pg_sys::numeric_out,
                &[Some(pg_sys::Datum::from(value.val.numeric))],
            ) else {
                return 0;
            };
            let text = text.cast_mut_ptr::<std::ffi::c_char>();
            let length = CStr::from_ptr(text).to_bytes().len();
            pg_sys::pfree(text.cast());
            length
        }
        _ => 5,
    }
}
