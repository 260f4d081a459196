//! Reading an event's stored values for a notification payload, never
//! more than a payload can carry: a value whose text cannot fit is not read
//! at all (its size comes from the stored datum's header, without
//! detoasting), so the worker's memory does not grow with event size.

use std::ffi::CStr;

use litebase_streams_core::payload::MAX_DATA_TEXT_BYTES;
use pgrx::prelude::*;

/// Stored data larger than this (uncompressed jsonb bytes) is never read:
/// its JSON text cannot fit a notification payload (jsonb's binary form is
/// at most a few times larger than its text).
const MAX_DATA_READ_BYTES: usize = 8 * MAX_DATA_TEXT_BYTES;

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
