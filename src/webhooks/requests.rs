//! The next request of a webhook: its events after its position (final
//! ones, at most `batch` and about [`MAX_BODY_BYTES`]), read as the
//! webhook's owner may, signed and written down before it is sent.

use std::io::Write;

use pgrx::datum::{DatumWithOid, TimestampWithTimeZone};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

use super::http::Request;
use super::state::{exec, persists_batches, Webhook, SENDING, SKIP};
use crate::error::SpiContext;
use crate::log::{privileges, publish};
use litebase_streams_core::filters::EventFilter;
use litebase_streams_core::names::{parse_stream_selector, StreamSelector};
use litebase_streams_core::payload::{write_full_payload, Event};
use litebase_streams_core::signing::signing_key;

/// About the most bytes one request body carries (one event always goes,
/// whatever its size).
pub(super) const MAX_BODY_BYTES: usize = 1 << 20;

/// The most bytes of larger bodies (single events over [`MAX_BODY_BYTES`])
/// in flight at once; one always may go. With the concurrency limit this
/// bounds the worker's memory: about `webhook_max_concurrency` MB plus this
/// (or one event larger than it).
pub(super) const MAX_LARGE_BYTES_IN_FLIGHT: i64 = 64 << 20;

/// The most positions one turn of a filtered webhook reads past its
/// position: a filter that matches nothing in a long backlog moves it in
/// steps of this, each one statement over a bounded range, instead of one
/// scan of the whole backlog that would hold up the other webhooks.
const FILTERED_SCAN_POSITIONS: i64 = 100_000;

/// What to send to a webhook next.
pub(super) enum Next {
    /// Nothing pending.
    Nothing,
    /// A large event waits until other large bodies are sent.
    Deferred,
    /// Its owner holds its row locked: the batch cannot be written down,
    /// nor the position moved past filtered-out events.
    Locked,
    /// It moved past events its filter leaves out: look again at once.
    Moved,
    Ready(Request),
}

/// The next request of `webhook`: its events after its position up to
/// `upto` (for a filtered webhook, at most [`FILTERED_SCAN_POSITIONS`] on).
/// Err((why, disable)) when the webhook cannot be served (its owner lost
/// the read privilege: disable it).
pub(super) fn next_request(
    webhook: &Webhook,
    upto: i64,
    log_id: &str,
    large_budget: i64,
) -> Result<Next, (String, bool)> {
    let Ok(selector) = parse_stream_selector(&webhook.pattern) else {
        return Err((format!("its stream pattern \"{}\" is invalid", webhook.pattern), true));
    };
    let Some(key) = signing_key(&webhook.secret) else {
        return Err(("its secret is not whsec_ and base64".into(), true));
    };
    let log = publish::position_sequence();
    if !privileges::as_owner(webhook.owner, || privileges::may_read_all(&webhook.pattern, log)) {
        return Err((
            format!(
                "its owner may no longer read every stream of \"{}\" (streams.grant('read', ...))",
                webhook.pattern
            ),
            true,
        ));
    }
    let upto = if webhook.filter.is_empty() {
        upto
    } else {
        upto.min(webhook.position.saturating_add(FILTERED_SCAN_POSITIONS))
    };
    // It reads the log, then the view: the readers' lock order first.
    crate::log::catalog::lock_for_reading();
    // Retention removed events it had not delivered (overrides_consumers, a
    // disabled webhook, one created below the cut): disabled, never a gap.
    if let Some(first) = crate::log::partitions::first_kept().filter(|&first| webhook.position < first - 1) {
        return Err((
            format!(
                "retention removed events it had not delivered: the log holds the positions from {first} on \
                 (SQLSTATE LS001); drop it and create it again with after => {}",
                first - 1
            ),
            true,
        ));
    }
    let envelope = crate::log::catalog::extension_log().is_some_and(crate::log::catalog::log_has_envelope);
    let read = Spi::connect_mut(|client| {
        let Some((planned_last, planned_bytes)) = plan_request(client, webhook, &selector, upto)? else {
            if !webhook.filter.is_empty() && upto > webhook.position {
                // Every final event up to `upto` is filtered out: move past
                // them, so that no later turn reads them again.
                let moved = exec(client, SKIP, None, &[webhook.id.into(), webhook.position.into(), upto.into()])?;
                return Ok(Ok(if moved.is_empty() { Next::Locked } else { Next::Moved }));
            }
            return Ok(Ok(Next::Nothing));
        };
        if planned_bytes > MAX_BODY_BYTES as i64
            && planned_bytes > large_budget
            && large_budget < MAX_LARGE_BYTES_IN_FLIGHT
        {
            return Ok(Ok(Next::Deferred));
        }
        let single = webhook.batch == 1;
        let mut body = Body::default();
        let (mut first, mut last) = (None, None);
        let events = events_between(client, &selector, &webhook.filter, webhook.position, planned_last, envelope)?;
        for row in events {
            if last.is_some() && body.0.len() >= MAX_BODY_BYTES {
                break; // the data printed larger than it is stored: the rest next time
            }
            let position = row.get::<i64>(1)?.unwrap_or(0);
            let event = Event {
                position,
                stream: row.get::<&str>(2)?.unwrap_or_default(),
                time_us: row.get::<TimestampWithTimeZone>(3)?.map_or(0, crate::log::commit_times::unix_micros),
                tx: row.get::<i64>(4)?.unwrap_or(0),
                prev: row.get::<i64>(5)?.unwrap_or(0),
                data: row.get::<&str>(6)?,
                type_: row.get::<&str>(7)?,
                key: row.get::<&str>(8)?,
                headers: row.get::<&str>(9)?,
                private: false,
            };
            let written = (|| {
                if !single {
                    body.write_all(if first.is_none() { b"[" } else { b"," })?;
                }
                write_full_payload(&mut body, &event)
            })();
            if let Err(error) = written {
                return Ok(Err(format!("building the request failed: {error}")));
            }
            first.get_or_insert(position);
            last = Some(position);
        }
        let (Some(first), Some(last)) = (first, last) else { return Ok(Ok(Next::Nothing)) };
        if !single && body.write_all(b"]").is_err() {
            return Ok(Err("building the request failed: out of memory".into()));
        }
        let log = log_id.replace('-', "");
        let id = if first == last {
            format!("msg_{log}_{}_{first}", webhook.id)
        } else {
            format!("msg_{log}_{}_{first}-{last}", webhook.id)
        };
        // Committed (synchronously) before the request goes out.
        if persists_batches()
            && webhook.sending_upto != Some(last)
            && exec(client, SENDING, None, &[webhook.id.into(), last.into()])?.is_empty()
        {
            return Ok(Ok(Next::Locked));
        }
        let request = Request {
            webhook: webhook.id,
            last,
            after: webhook.position,
            url: webhook.url.clone(),
            id,
            key,
            body: body.0,
        };
        Ok::<_, pgrx::spi::Error>(Ok(Next::Ready(request)))
    });
    read.context("reading a webhook's events")
        .map_err(|error| (format!("webhook \"{}\": {error}", webhook.name), false))
}

/// The last position the next request carries, and the size of its data:
/// at most `batch` events after the position, up to `upto`, and no more
/// than about [`MAX_BODY_BYTES`] (at least one event). Sizes are the
/// uncompressed size of the stored jsonb, read without detoasting it.
fn plan_request(
    client: &mut SpiClient<'_>,
    webhook: &Webhook,
    selector: &StreamSelector,
    upto: i64,
) -> SpiResult<Option<(i64, i64)>> {
    let (condition, values) = webhook.filter.events_condition(selector, "e", 4);
    let sql = format!(
        "SELECT e.position, e.data FROM streams.event_log e
         WHERE e.position > $1 AND e.position <= $2 {condition} ORDER BY e.position LIMIT $3"
    );
    let mut all: Vec<DatumWithOid> = vec![webhook.position.into(), upto.into(), webhook.batch.into()];
    all.extend(values.iter().map(|value| DatumWithOid::from(value.as_str())));
    let (mut last, mut bytes) = (None, 0i64);
    let mut rows = exec(client, &sql, None, &all)?;
    while let Some(row) = rows.next() {
        let position = row.get::<i64>(1)?;
        // SAFETY: a non-null jsonb datum of the current row, valid for this SPI call; only its
        // header is read (no detoasting).
        let size =
            rows.get_datum_by_ordinal(2)?.map_or(0, |datum| unsafe { pg_sys::toast_raw_datum_size(datum) } as i64);
        if last.is_some() && bytes + size > MAX_BODY_BYTES as i64 {
            break;
        }
        bytes += size;
        last = position;
    }
    Ok(last.map(|last| (last, bytes)))
}

/// The events of the pattern in `(after, last]` that pass the filter, as
/// the payload needs them, with their envelope when the log has one
/// (`envelope`: not before the 0.3.0 update, whose view has no such columns).
fn events_between<'conn>(
    client: &mut SpiClient<'conn>,
    selector: &StreamSelector,
    event_filter: &EventFilter,
    after: i64,
    last: i64,
    envelope: bool,
) -> SpiResult<pgrx::spi::SpiTupleTable<'conn>> {
    let (condition, values) = event_filter.events_condition(selector, "e", 3);
    let envelope = if envelope { "e.type, e.key, e.headers::text" } else { "NULL::text, NULL::text, NULL::text" };
    let sql = format!(
        "SELECT e.position, e.stream::text, e.time, e.tx::text::bigint,
                coalesce((SELECT p.position FROM streams.event_log p
                          WHERE p.stream = e.stream AND p.position < e.position
                          ORDER BY p.position DESC LIMIT 1), 0),
                e.data::text, {envelope}
         FROM streams.events e
         WHERE e.position > $1 AND e.position <= $2 {condition} ORDER BY e.position"
    );
    let mut all: Vec<DatumWithOid> = vec![after.into(), last.into()];
    all.extend(values.iter().map(|value| DatumWithOid::from(value.as_str())));
    exec(client, &sql, None, &all)
}

/// A request body that reports an allocation failure as an error instead
/// of aborting the process (which would restart the whole server).
#[derive(Default)]
struct Body(Vec<u8>);

impl Write for Body {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.try_reserve(bytes.len()).map_err(|_| std::io::Error::from(std::io::ErrorKind::OutOfMemory))?;
        self.0.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

type SpiResult<T> = Result<T, pgrx::spi::Error>;
