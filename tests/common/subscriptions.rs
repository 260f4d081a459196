//! Helpers of the subscription tests (tests/subscriptions.rs,
//! tests/subscription_claims.rs, tests/subscription_security.rs): publish
//! and wait, poll and ack (in the simple protocol, so they work through
//! pgbouncer too), a subscription's progress, and a long poll in a thread of
//! its own.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use postgres::{Client, Config};

use super::pgbouncer::{column, rows};
use super::{connect_retrying, publish_batches, sqlstate, wait_for_horizon, wait_until};

/// Publish `count` events to `stream`, `per_tx` to a transaction, and wait
/// until they are final. Their positions, in order.
pub fn publish_events(c: &mut Client, stream: &str, count: usize, per_tx: usize) -> Vec<i64> {
    let positions = publish_batches(c, stream, count, per_tx, "jsonb_build_object('n', g)");
    wait_for_horizon(c, *positions.last().unwrap());
    positions
}

/// The positions a poll returns (the simple protocol: works through pgbouncer too).
pub fn try_poll(c: &mut Client, sub: &str, max: i32) -> Result<Vec<i64>, postgres::Error> {
    column(c, &format!("SELECT position FROM streams.poll('{sub}', {max})"))
}

pub fn poll(c: &mut Client, sub: &str, max: i32) -> Vec<i64> {
    try_poll(c, sub, max).unwrap_or_else(|e| panic!("poll of {sub}: {e}"))
}

pub fn try_ack(c: &mut Client, sub: &str, through: i64) -> Result<(), postgres::Error> {
    c.batch_execute(&format!("SELECT streams.ack('{sub}', {through})"))
}

pub fn ack(c: &mut Client, sub: &str, through: i64) {
    try_ack(c, sub, through).unwrap_or_else(|e| panic!("ack of {sub} through {through}: {e}"));
}

/// Poll (at most `max`), ack everything polled and commit: the positions.
pub fn consume(c: &mut Client, sub: &str, max: i32) -> Vec<i64> {
    c.batch_execute("BEGIN").unwrap();
    let got = poll(c, sub, max);
    if let Some(&last) = got.last() {
        ack(c, sub, last);
    }
    c.batch_execute("COMMIT").unwrap();
    got
}

/// A subscription's row of `streams.subscriptions`, as `c` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    pub position: i64,
    pub pending: i64,
    pub claimed: i64,
}

pub fn progress(c: &mut Client, sub: &str) -> Progress {
    let row = rows(c, &format!("SELECT position, pending, claimed FROM streams.subscriptions WHERE name = '{sub}'"))
        .unwrap()
        .pop()
        .unwrap_or_else(|| panic!("no row for {sub} in streams.subscriptions"));
    let num = |i: usize| row[i].as_deref().expect("not null").parse::<i64>().unwrap();
    Progress { position: num(0), pending: num(1), claimed: num(2) }
}

/// The stored state of every subscription (name, stream, ordered, position), as a superuser.
pub fn stored_subscriptions(c: &mut Client) -> Vec<(String, String, bool, i64)> {
    c.query("SELECT name, stream, ordered, position FROM streams.subscription_state ORDER BY name", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

/// `sql` fails with `state` (the statement runs alone, in its own transaction
/// unless one is open).
pub fn fails_with(c: &mut Client, sql: &str, state: &str) -> postgres::Error {
    match c.batch_execute(sql) {
        Ok(()) => panic!("{sql} succeeded; expected SQLSTATE {state}"),
        Err(e) => {
            assert_eq!(sqlstate(&e), state, "{sql}: {e}");
            e
        }
    }
}

pub fn backend_pid(c: &mut Client) -> i32 {
    column(c, "SELECT pg_backend_pid()").unwrap()[0]
}

/// Whether backend `pid` sleeps in a long poll (an extension wait event).
pub fn in_long_poll(admin: &mut Client, pid: i32) -> bool {
    admin
        .query_opt(
            "SELECT wait_event_type = 'Extension' FROM pg_stat_activity WHERE pid = $1 AND state = 'active'",
            &[&pid],
        )
        .unwrap()
        .is_some_and(|r| r.get::<_, Option<bool>>(0) == Some(true))
}

pub fn backend_exists(admin: &mut Client, pid: i32) -> bool {
    admin.query_opt("SELECT 1 FROM pg_stat_activity WHERE pid = $1", &[&pid]).unwrap().is_some()
}

/// A long poll running in a thread of its own, in a transaction, on a
/// connection from `config`: `setup` runs in the transaction first, then
/// the poll, which the thread reports with its duration.
pub struct LongPoll {
    pub pid: i32,
    pub cancel: postgres::CancelToken,
    thread: std::thread::JoinHandle<(Result<Vec<i64>, postgres::Error>, Duration)>,
}

impl LongPoll {
    pub fn start(config: &Config, sub: &str, wait: &str, setup: &str) -> LongPoll {
        let (config, sql, setup) =
            (config.clone(), format!("SELECT position FROM streams.poll('{sub}', 10, '{wait}')"), setup.to_owned());
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let mut c = connect_retrying(&config);
            c.batch_execute("BEGIN").unwrap();
            if !setup.is_empty() {
                c.batch_execute(&setup).unwrap();
            }
            tx.send((backend_pid(&mut c), c.cancel_token())).unwrap();
            let started = Instant::now();
            let result = column(&mut c, &sql);
            let took = started.elapsed();
            let _ = c.batch_execute("ROLLBACK");
            (result, took)
        });
        let (pid, cancel) = rx.recv_timeout(Duration::from_secs(30)).expect("the long poll's backend pid");
        LongPoll { pid, cancel, thread }
    }

    /// Wait until it sleeps in the poll.
    pub fn wait_until_sleeping(&self, admin: &mut Client) {
        wait_until("the poll sleeps", Duration::from_secs(20), || in_long_poll(admin, self.pid));
    }

    pub fn join(self) -> (Result<Vec<i64>, postgres::Error>, Duration) {
        self.thread.join().expect("the polling thread")
    }
}

// --- deliveries with their attempts (tests/subscription_retries.rs, tests/subscription_leases.rs)

/// One event a poll returned, and which delivery attempt of it that was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    pub position: i64,
    pub attempt: i32,
}

pub fn at(position: i64, attempt: i32) -> Delivery {
    Delivery { position, attempt }
}

/// What a poll that returns nothing returns.
pub const NOTHING: [Delivery; 0] = [];

/// A text value of the simple protocol as a number.
pub fn num<T: std::str::FromStr>(value: &Option<String>) -> T
where
    T::Err: std::fmt::Debug,
{
    value.as_deref().expect("not null").parse().expect("a number")
}

/// The one value of a one-row, one-column query, as text (None: SQL null).
pub fn value(c: &mut Client, sql: &str) -> Option<String> {
    let mut r = rows(c, sql).unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    assert_eq!(r.len(), 1, "{sql}: one row");
    r.pop().unwrap().swap_remove(0)
}

/// A boolean query's answer.
pub fn holds(c: &mut Client, sql: &str) -> bool {
    value(c, sql).as_deref() == Some("t")
}

/// Poll `sub` (at most `max`, in a transaction) until a poll returns events:
/// those, and how many seconds after `since` (a timestamptz) the polling
/// A poll's deliveries, (position, attempt), waiting up to `wait` (an
/// interval) for events.
pub fn try_deliveries(c: &mut Client, sub: &str, max: i32, wait: &str) -> Result<Vec<Delivery>, postgres::Error> {
    Ok(rows(c, &format!("SELECT position, attempt FROM streams.poll('{sub}', {max}, '{wait}')"))?
        .iter()
        .map(|r| at(num(&r[0]), num(&r[1])))
        .collect())
}

/// statement returned them, by the database's clock. The transaction stays open.
pub fn poll_until_delivered(c: &mut Client, sub: &str, max: i32, since: &str) -> (Vec<Delivery>, f64) {
    let mut got = (Vec::new(), 0.0);
    wait_until(&format!("{sub} delivers again"), Duration::from_secs(30), || {
        c.batch_execute("BEGIN").unwrap();
        let r = rows(
            c,
            &format!(
                "SELECT position, attempt, extract(epoch FROM clock_timestamp() - '{since}'::timestamptz)
                 FROM streams.poll('{sub}', {max}, '100 milliseconds')"
            ),
        )
        .unwrap();
        if r.is_empty() {
            c.batch_execute("COMMIT").unwrap();
            return false;
        }
        got = (r.iter().map(|r| at(num(&r[0]), num(&r[1]))).collect(), num(&r[0][2]));
        true
    });
    got
}
