//! Webhooks: committed events POSTed to HTTP endpoints, signed per the
//! Standard Webhooks specification, in position order, retried until
//! delivered (sql/webhooks.sql has the SQL side).
//!
//! A webhook is an ordered subscription whose consumer is the extension:
//! its `position` moves only after the endpoint answered 2xx, in a
//! transaction that commits synchronously, so a crash repeats at most the
//! request in flight. Requests are made by a background worker of their own
//! (one per database with webhooks, worker.rs), never by a user's backend,
//! on one thread per request (http.rs), so a slow endpoint delays only its
//! own webhook, and LISTEN delivery not at all. hosts.rs decides which
//! addresses a request may reach.
//!
//! The SQL functions here are not SECURITY DEFINER: like the subscription
//! functions they check the caller (EXECUTE on `create_webhook` is the
//! privilege to create one; a member of the owner manages it), then use the
//! tables as the extension's owner.

mod http;
mod requests;
mod state;
mod worker;

use std::cell::Cell;

use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;

use crate::error::{OrRaise, StreamsError};
use crate::subscriptions::{self, as_owner};
use crate::{gucs, shmem};
use litebase_streams_core::filters::EventFilter;
use litebase_streams_core::{hosts, signing};

pub use worker::ensure_worker;

/// The most events one request may carry.
const MAX_BATCH: i32 = 1000;

/// Random bytes in a secret `create_webhook` makes.
const SECRET_BYTES: usize = 32;

/// `streams.create_webhook(name, stream, url, after, secret, batch, types,
/// filter)`: the signing secret.
#[allow(clippy::too_many_arguments)] // the SQL function's arguments
#[pg_extern(sql = false)]
fn _create_filtered_webhook(
    name: Option<&str>,
    stream: Option<&str>,
    url: Option<&str>,
    after: Option<i64>,
    secret: Option<&str>,
    batch: Option<i32>,
    types: Option<Vec<Option<String>>>,
    filter: Option<pgrx::JsonB>,
) -> String {
    create_webhook(name, stream, url, after, secret, batch, subscriptions::checked_filter(types, filter))
}

/// `streams.create_webhook(name, stream, url, after, secret, batch)` as
/// 0.2.0 declares it (a database not yet updated): no filter.
#[pg_extern(sql = false)]
fn _create_webhook(
    name: Option<&str>,
    stream: Option<&str>,
    url: Option<&str>,
    after: Option<i64>,
    secret: Option<&str>,
    batch: Option<i32>,
) -> String {
    create_webhook(name, stream, url, after, secret, batch, EventFilter::default())
}

fn create_webhook(
    name: Option<&str>,
    stream: Option<&str>,
    url: Option<&str>,
    after: Option<i64>,
    secret: Option<&str>,
    batch: Option<i32>,
    filter: EventFilter,
) -> String {
    // The readers' lock order first: an upgrade step takes it too.
    crate::log::catalog::lock_for_reading();
    let name = name.ok_or(StreamsError::NullArgument("name")).or_raise();
    let stream = stream.ok_or(StreamsError::NullArgument("stream")).or_raise();
    let url = url.ok_or(StreamsError::NullArgument("url")).or_raise();
    let batch = batch.ok_or(StreamsError::NullArgument("batch")).or_raise();
    crate::require_preload().or_raise();
    if !(1..=MAX_BATCH).contains(&batch) {
        StreamsError::ArgumentOutOfRange { argument: "batch", value: batch.into(), min: 1, max: MAX_BATCH.into() }
            .raise();
    }
    let url = checked_url(url);
    let secret = match secret {
        Some(given) if signing::signing_key(given).is_some_and(|key| (24..=64).contains(&key.len())) => {
            given.to_owned()
        }
        Some(_) => StreamsError::InvalidWebhookSecret.raise(),
        None => signing::encode_secret(&random_bytes::<SECRET_BYTES>()),
    };
    let start = after.unwrap_or_else(crate::subscriptions::wait::horizon_seen_by_transaction);
    let id = subscriptions::create(name, stream, start, true);
    subscriptions::store_filter(id, &filter);
    as_owner(|client| {
        let args: [DatumWithOid; 4] = [id.into(), url.as_str().into(), secret.as_str().into(), batch.into()];
        client.update(
            "INSERT INTO streams.webhook_state (subscription, url, secret, batch) VALUES ($1, $2, $3, $4)",
            None,
            &args,
        )?;
        Ok(())
    });
    start_delivery();
    secret
}

/// `streams.drop_webhook(name)`: true if it existed.
#[pg_extern(sql = false)]
fn _drop_webhook(name: Option<&str>) -> bool {
    // The readers' lock order first: an upgrade step takes it too.
    crate::log::catalog::lock_for_reading();
    let name = name.ok_or(StreamsError::NullArgument("name")).or_raise();
    let Some(webhook) = subscriptions::find(name).filter(|s| s.webhook) else { return false };
    subscriptions::check_member(&webhook);
    as_owner(|client| {
        client.update("DELETE FROM streams.subscription_state WHERE id = $1", None, &[webhook.id.into()])?;
        Ok(())
    });
    wake_worker_at_commit();
    true
}

/// `streams.pause_webhook(name)`.
#[pg_extern(sql = false)]
fn _pause_webhook(name: Option<&str>) {
    // The readers' lock order first: an upgrade step takes it too.
    crate::log::catalog::lock_for_reading();
    let webhook = open(name);
    as_owner(|client| {
        client.update(
            "UPDATE streams.webhook_state SET paused = true WHERE subscription = $1",
            None,
            &[webhook.into()],
        )?;
        Ok(())
    });
    wake_worker_at_commit();
}

/// `streams.resume_webhook(name)`: deliver again, from where it stopped,
/// with the next attempt at once and the failure count reset.
#[pg_extern(sql = false)]
fn _resume_webhook(name: Option<&str>) {
    // The readers' lock order first: an upgrade step takes it too.
    crate::log::catalog::lock_for_reading();
    let webhook = open(name);
    as_owner(|client| {
        client.update(
            "UPDATE streams.webhook_state
             SET paused = false, disabled_at = NULL, attempts = 0, failing_since = NULL, next_attempt_at = NULL
             WHERE subscription = $1",
            None,
            &[webhook.into()],
        )?;
        Ok(())
    });
    start_delivery();
}

/// The id of the webhook named `name`, which the caller may manage, or raise.
fn open(name: Option<&str>) -> i32 {
    let name = name.ok_or(StreamsError::NullArgument("name")).or_raise();
    let webhook = subscriptions::find(name)
        .filter(|s| s.webhook)
        .unwrap_or_else(|| StreamsError::UnknownWebhook(name.to_owned()).raise());
    subscriptions::check_member(&webhook);
    webhook.id
}

/// The URL, checked against the URL rules and the address policy (22023).
fn checked_url(url: &str) -> String {
    let invalid = |reason: String| -> ! { StreamsError::InvalidWebhookUrl { url: url.to_owned(), reason }.raise() };
    let allowed = hosts::Allowed::parse(&gucs::webhook_allowed_hosts())
        .unwrap_or_else(|e| invalid(format!("litebase_streams.webhook_allowed_hosts is invalid: {e}")));
    hosts::check_url(url, &allowed).unwrap_or_else(|reason| invalid(reason)).to_string()
}

/// Make sure this database's webhook worker runs once the transaction
/// commits. The database's worker starts it (never a user's backend: a
/// transaction calling this a thousand times asks once, at commit).
fn start_delivery() {
    START_AT_COMMIT.with(|w| w.set(true));
    wake_worker_at_commit();
}

thread_local! {
    static WAKE_AT_COMMIT: Cell<bool> = const { Cell::new(false) };
    static START_AT_COMMIT: Cell<bool> = const { Cell::new(false) };
    static CALLBACK_REGISTERED: Cell<bool> = const { Cell::new(false) };
}

/// Have the webhook worker look at the webhooks again when this
/// transaction commits (before, it would not see the change).
fn wake_worker_at_commit() {
    WAKE_AT_COMMIT.with(|w| w.set(true));
    if !CALLBACK_REGISTERED.with(|r| r.replace(true)) {
        // SAFETY: registers a plain function for the rest of this backend's life; it touches a
        // thread-local flag, atomics and SetLatch only.
        unsafe { pg_sys::RegisterXactCallback(Some(xact_callback), std::ptr::null_mut()) };
    }
}

/// # Safety
/// SAFETY: registered with RegisterXactCallback; at commit it only reads atomics and sets a latch.
#[pg_guard]
unsafe extern "C-unwind" fn xact_callback(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    match event {
        XACT_EVENT_COMMIT | XACT_EVENT_PARALLEL_COMMIT => {
            let start = START_AT_COMMIT.with(|w| w.replace(false));
            if WAKE_AT_COMMIT.with(|w| w.replace(false)) {
                if let Some(entry) = shmem::find_db(pg_sys::MyDatabaseId) {
                    entry.wake_webhook_worker();
                    if start && entry.webhook_pid.load(std::sync::atomic::Ordering::Acquire) == 0 {
                        entry.webhooks_wanted.store(true, std::sync::atomic::Ordering::Release);
                        entry.wake_worker();
                    }
                }
            }
        }
        XACT_EVENT_ABORT | XACT_EVENT_PARALLEL_ABORT => {
            WAKE_AT_COMMIT.with(|w| w.set(false));
            START_AT_COMMIT.with(|w| w.set(false));
        }
        _ => {}
    }
}

/// `N` bytes from PostgreSQL's strong random source.
fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    // SAFETY: writes N bytes into a local buffer of N bytes.
    if !unsafe { pg_sys::pg_strong_random(bytes.as_mut_ptr().cast(), N) } {
        StreamsError::NoRandomSource.raise();
    }
    bytes
}
