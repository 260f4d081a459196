//! One entry per database: its worker and webhook worker, what they
//! publish about themselves (horizon, state, rounds, starts), a publisher's request
//! for a worker, and the databases dropped lately. An entry is claimed,
//! attached to and freed under the tranche's LWLock, so that it is never
//! freed between a claim and an attach; everything else is atomics (safe
//! in commit callbacks).

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU32, AtomicU64, Ordering};

use pgrx::pg_sys;

use super::{available, db_entries_of, db_lock, header};

/// What the worker of one database publishes about itself.
#[repr(C)]
pub struct DbEntry {
    pub(super) db: AtomicU32,
    /// pid of the worker serving this database, 0 when none.
    pub worker_pid: AtomicI32,
    /// pgprocno of that worker, -1 when none: publishers set its latch.
    pub(super) worker_procno: AtomicI32,
    /// Set by publishers at commit, cleared by the worker before each round.
    pub wake: AtomicBool,
    /// Set by a poller that wrote a delivery request (deliveries.rs).
    pub deliveries_wanted: AtomicBool,
    /// Set by a publisher that found no partition of the log for its
    /// position (log/partitions.rs): the worker makes it and the publisher
    /// waits, rather than making it in its own transaction, whose lock on
    /// the log would hold every other publisher until it ends.
    pub partitions_wanted: AtomicBool,
    /// Set by a backend about to DROP DATABASE: the worker leaves for good.
    pub stop: AtomicBool,
    /// The worker's persisted horizon.
    pub horizon: AtomicU64,
    /// The `streams.position_seq` of the log `horizon` belongs to (it names
    /// the log: DROP and CREATE EXTENSION make another), 0 before the
    /// worker's first round. Stored after `horizon`.
    pub log_sequence: AtomicU32,
    /// The highest position publishers took (for `max_backlog`).
    pub newest: AtomicU64,
    /// The last position the worker notified.
    pub delivered: AtomicU64,
    /// See [`WorkerState`].
    pub state: AtomicU32,
    /// See [`NotifyState`]: whether the last attempt to send notifications failed.
    pub notify_state: AtomicU32,
    /// A publisher found no worker here: the launcher should start one.
    needs_worker: AtomicBool,
    /// When `needs_worker` was set (TimestampTz): a worker that is merely
    /// starting or restarting gets a grace period before the launcher adds one.
    needs_worker_since: AtomicI64,
    /// The last attempt to start this database's worker found no free slot.
    pub no_slot: AtomicBool,
    /// Delivery rounds the worker ran (a transaction each).
    pub rounds: AtomicU64,
    /// Workers that attached to this entry since the server started (or
    /// the entry was last freed): restarts are this minus one.
    pub worker_starts: AtomicU64,
    /// Failed attempts of the worker to send notifications: a notification
    /// round that failed, or a combined round that NOTIFY failed (a full
    /// queue). Visibility does not wait for either.
    pub notification_failures: AtomicU64,
    /// pid of the webhook worker serving this database, 0 when none.
    pub webhook_pid: AtomicI32,
    /// A transaction that created or resumed a webhook committed: the
    /// database's worker starts the webhook worker if none runs.
    pub webhooks_wanted: AtomicBool,
    /// pgprocno of that worker, -1 when none.
    pub(super) webhook_procno: AtomicI32,
    /// The worker left for good (the extension was dropped, or the database
    /// became a template): the entry is freed once the webhook worker has
    /// left too. A worker that exits to be restarted keeps the entry.
    retired: AtomicBool,
}

/// Whether notifications are going out. Visibility never depends on it: the
/// horizon advances in a transaction of its own while notifications fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum NotifyState {
    Ok = 0,
    /// PostgreSQL's notification queue is full (SQLSTATE 54000).
    QueueFull = 1,
    /// Another error; the server log has it.
    Failing = 2,
}

impl NotifyState {
    pub fn name(raw: u32) -> &'static str {
        match raw {
            0 => "ok",
            1 => "failing: the notification queue is full",
            _ => "failing: see the server log",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum WorkerState {
    Starting = 0,
    Idle = 1,
    Delivering = 2,
    Retrying = 3,
}

impl WorkerState {
    pub fn name(raw: u32) -> &'static str {
        match raw {
            0 => "starting",
            1 => "idle",
            2 => "delivering",
            _ => "retrying",
        }
    }
}

/// How many dropped databases are remembered. A worker is restarted one
/// second after it exited, so only the drops of about the last second matter.
pub(super) const DROPPED_REMEMBERED: usize = 16;

/// A worker that has not attached this long after a publisher found none
/// is missing (one just launched or restarting attaches well within it).
const WORKER_GRACE_US: i64 = 3_000_000;

/// Databases whose publishers found no worker and that still have none,
/// for longer than the grace period.
pub fn databases_needing_a_worker() -> Vec<pg_sys::Oid> {
    // SAFETY: reads the clock; no ERROR possible.
    let now = unsafe { pg_sys::GetCurrentTimestamp() };
    db_entries_of(header())
        .iter()
        .filter(|e| {
            let db = e.db.load(Ordering::Acquire);
            db != 0
                && e.needs_worker.load(Ordering::Acquire)
                && now - e.needs_worker_since.load(Ordering::Acquire) >= WORKER_GRACE_US
                && e.worker_pid.load(Ordering::Acquire) == 0
                && !e.stop.load(Ordering::Acquire)
        })
        .map(|e| pg_sys::Oid::from(e.db.load(Ordering::Acquire)))
        .collect()
}

/// Remember that database `db` was dropped. A worker of it that was
/// terminated (pg_terminate_backend, or DROP DATABASE ... WITH (FORCE) while
/// it was starting) is restarted by the postmaster a second later, and
/// connecting to a database that is gone is a FATAL error: exit code 1, so
/// restarted again, every second until the server stops. Such a worker
/// looks here first and leaves with exit code 0. Atomics only.
pub fn remember_dropped(db: pg_sys::Oid) {
    // SAFETY: header() points into shared memory that lives as long as the server; atomics only.
    let header = unsafe { &*header() };
    let place = header.dropped_next.fetch_add(1, Ordering::AcqRel) as usize % DROPPED_REMEMBERED;
    header.dropped[place].store(db.to_u32(), Ordering::Release);
}

/// Whether database `db` was dropped lately (see [`remember_dropped`]).
pub fn was_dropped(db: pg_sys::Oid) -> bool {
    // SAFETY: as in remember_dropped.
    available() && unsafe { &*header() }.dropped.iter().any(|d| d.load(Ordering::Acquire) == db.to_u32())
}

/// A database exists again under `db` (OIDs are reused after wraparound):
/// its workers may run.
pub fn forget_dropped(db: pg_sys::Oid) {
    // SAFETY: as in remember_dropped.
    for d in &unsafe { &*header() }.dropped {
        let _ = d.compare_exchange(db.to_u32(), 0, Ordering::AcqRel, Ordering::Relaxed);
    }
}

/// The entry of database `db`, if one was claimed.
pub fn find_db(db: pg_sys::Oid) -> Option<&'static DbEntry> {
    entry_of(db_entries_of(header()), db)
}

/// The entry of database `db`, claiming a free one if needed. `None` when the
/// table is full (more databases than `max_worker_processes`).
pub fn claim_db(db: pg_sys::Oid) -> Option<&'static DbEntry> {
    with_db_lock(|entries| find_or_claim(entries, db))
}

/// Run `f` on the database entries while holding the lock that makes
/// claiming, attaching and freeing an entry one step each.
fn with_db_lock<T>(f: impl FnOnce(&'static [DbEntry]) -> T) -> T {
    let lock = db_lock();
    // SAFETY: the tranche's lock in shared memory, live as long as the server; `f` touches atomics
    // only and never raises, so the lock is always released here (an ERROR elsewhere releases
    // every LWLock at abort anyway).
    unsafe { pg_sys::LWLockAcquire(lock, pg_sys::LWLockMode::LW_EXCLUSIVE) };
    let result = f(db_entries_of(header()));
    // SAFETY: acquired above by this process.
    unsafe { pg_sys::LWLockRelease(lock) };
    result
}

/// The entry claimed for database `db`, if any.
fn entry_of(entries: &'static [DbEntry], db: pg_sys::Oid) -> Option<&'static DbEntry> {
    entries.iter().find(|e| e.is_for(db))
}

fn find_or_claim(entries: &'static [DbEntry], db: pg_sys::Oid) -> Option<&'static DbEntry> {
    entry_of(entries, db).or_else(|| {
        let free = entries.iter().find(|e| e.db.load(Ordering::Acquire) == 0)?;
        free.db.store(db.to_u32(), Ordering::Release);
        Some(free)
    })
}

/// The two kinds of process that serve a database from its entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    Worker,
    WebhookWorker,
}

/// What [`attach`] found.
pub enum Attach {
    Attached(&'static DbEntry),
    /// Another live process of that kind serves the database.
    Taken,
    /// A DROP DATABASE is waiting for the database's workers to leave.
    Stopping,
    /// Every entry belongs to another database.
    Full,
}

/// Become the `server` of database `db`: claim its entry and attach in one
/// step under the lock, so that [`detach`] never frees an entry between the
/// two.
pub fn attach(db: pg_sys::Oid, server: Server, pid: i32, procno: i32) -> Attach {
    with_db_lock(|entries| {
        let Some(entry) = find_or_claim(entries, db) else { return Attach::Full };
        if entry.stop.load(Ordering::Acquire) {
            return Attach::Stopping;
        }
        let (pid_of, procno_of) = match server {
            Server::Worker => (&entry.worker_pid, &entry.worker_procno),
            Server::WebhookWorker => (&entry.webhook_pid, &entry.webhook_procno),
        };
        if pid_of.compare_exchange(0, pid, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return Attach::Taken;
        }
        procno_of.store(procno, Ordering::Release);
        if server == Server::Worker {
            entry.worker_starts.fetch_add(1, Ordering::Relaxed);
            entry.retired.store(false, Ordering::Release);
            entry.needs_worker.store(false, Ordering::Release);
            entry.no_slot.store(false, Ordering::Release);
        }
        Attach::Attached(entry)
    })
}

/// The `server` process `pid` leaves `entry` (at its exit); `for_good`:
/// the worker leaves because the extension was dropped or the database
/// became a template (it is not restarted). The entry is freed for another
/// database once the worker left for good, the webhook worker has left
/// too, no publisher asks for a worker and no DROP DATABASE waits (which
/// frees it itself). A worker that exits to be restarted (an error,
/// `pg_terminate_backend`) keeps the entry, so publishers that cached it go
/// on using the right one.
pub fn detach(entry: &DbEntry, server: Server, pid: i32, for_good: bool) {
    with_db_lock(|_| {
        let (pid_of, procno_of) = match server {
            Server::Worker => (&entry.worker_pid, &entry.worker_procno),
            Server::WebhookWorker => (&entry.webhook_pid, &entry.webhook_procno),
        };
        if pid_of.load(Ordering::Acquire) != pid {
            return;
        }
        procno_of.store(-1, Ordering::Release);
        pid_of.store(0, Ordering::Release);
        if server == Server::Worker && for_good {
            entry.retired.store(true, Ordering::Release);
        }
        if entry.retired.load(Ordering::Acquire) && entry.unused() {
            entry.forget();
        }
    })
}

/// Free database `db`'s entry if nothing uses it: its worker found no
/// extension (a `CREATE EXTENSION` that claimed the entry rolled back) or a
/// template, and so never attached.
pub fn release_if_unused(db: pg_sys::Oid) {
    with_db_lock(|entries| {
        if let Some(entry) = entry_of(entries, db) {
            if entry.unused() {
                entry.forget();
            }
        }
    })
}

/// Ask the workers of database `db` to leave for good (DROP DATABASE waits
/// for them), in one step with finding its entry, so that the entry cannot
/// be freed and given to another database in between. The entry, if any.
pub fn request_stop(db: pg_sys::Oid) -> Option<&'static DbEntry> {
    with_db_lock(|entries| {
        let entry = entry_of(entries, db)?;
        entry.stop.store(true, Ordering::Release);
        Some(entry)
    })
}

impl DbEntry {
    /// No worker of either kind, no publisher asking for one, no DROP
    /// DATABASE waiting. Call under the lock.
    fn unused(&self) -> bool {
        self.worker_pid.load(Ordering::Acquire) == 0
            && self.webhook_pid.load(Ordering::Acquire) == 0
            && !self.needs_worker.load(Ordering::Acquire)
            && !self.stop.load(Ordering::Acquire)
    }

    /// Whether this entry is database `db`'s: entries are freed and reused,
    /// so a reference kept across transactions is checked first.
    pub fn is_for(&self, db: pg_sys::Oid) -> bool {
        self.db.load(Ordering::Acquire) == db.to_u32()
    }

    /// Set the webhook worker's latch (webhooks changed, or DROP DATABASE).
    /// Atomics and `SetLatch` only.
    pub fn wake_webhook_worker(&self) {
        let procno = self.webhook_procno.load(Ordering::Acquire);
        if procno >= 0 && self.webhook_pid.load(Ordering::Acquire) != 0 {
            // SAFETY: as in wake_worker: a pgprocno the webhook worker stored for itself.
            unsafe {
                let proc_ = (*pg_sys::ProcGlobal).allProcs.add(procno as usize);
                pg_sys::SetLatch(&raw mut (*proc_).procLatch);
            }
        }
    }

    /// Free this entry for another database (after DROP DATABASE, or see
    /// [`detach`]).
    pub fn forget(&self) {
        self.horizon.store(0, Ordering::Relaxed);
        self.log_sequence.store(0, Ordering::Relaxed);
        self.newest.store(0, Ordering::Relaxed);
        self.rounds.store(0, Ordering::Relaxed);
        self.worker_starts.store(0, Ordering::Relaxed);
        self.notification_failures.store(0, Ordering::Relaxed);
        self.state.store(WorkerState::Starting as u32, Ordering::Relaxed);
        self.webhooks_wanted.store(false, Ordering::Relaxed);
        self.partitions_wanted.store(false, Ordering::Relaxed);
        self.retired.store(false, Ordering::Relaxed);
        self.delivered.store(0, Ordering::Relaxed);
        self.notify_state.store(0, Ordering::Relaxed);
        self.needs_worker.store(false, Ordering::Relaxed);
        self.no_slot.store(false, Ordering::Relaxed);
        self.db.store(0, Ordering::Release);
    }

    /// Ask the launcher for a worker here (it waits out the grace period).
    /// Atomics only.
    pub fn request_worker(&self) {
        // The time first, so the launcher never sees the flag with an old time.
        if !self.needs_worker.load(Ordering::Acquire) {
            // SAFETY: reads the clock; no ERROR possible.
            self.needs_worker_since.store(unsafe { pg_sys::GetCurrentTimestamp() }, Ordering::Release);
            self.needs_worker.store(true, Ordering::Release);
        }
    }

    pub fn set_state(&self, state: WorkerState) {
        self.state.store(state as u32, Ordering::Relaxed);
    }

    /// Ask the worker to record the deliveries in the mailboxes: whether a
    /// worker serves the database. Atomics and `SetLatch` only.
    pub fn wake_for_deliveries(&self) -> bool {
        self.deliveries_wanted.store(true, Ordering::SeqCst);
        self.set_worker_latch()
    }

    /// Ask the worker to make the log's missing partition. Atomics and
    /// `SetLatch` only.
    pub fn wake_for_partitions(&self) {
        self.partitions_wanted.store(true, Ordering::SeqCst);
        self.set_worker_latch();
    }

    /// Set the worker's latch, after a flag it looks at: whether a worker
    /// serves the database.
    fn set_worker_latch(&self) -> bool {
        let procno = self.worker_procno.load(Ordering::Acquire);
        if procno < 0 || self.worker_pid.load(Ordering::Acquire) == 0 {
            return false;
        }
        // SAFETY: as in wake_worker.
        unsafe {
            let proc_ = (*pg_sys::ProcGlobal).allProcs.add(procno as usize);
            pg_sys::SetLatch(&raw mut (*proc_).procLatch);
        }
        true
    }

    /// Wake the worker: flip the flag and set its latch once. Atomics and
    /// `SetLatch` only, so it is safe inside a commit callback.
    pub fn wake_worker(&self) {
        if self.wake.swap(true, Ordering::AcqRel) {
            return; // already woken, not yet served
        }
        let procno = self.worker_procno.load(Ordering::Acquire);
        if procno >= 0 {
            // SAFETY: a worker stored its own pgprocno here, so it indexes allProcs (shared memory
            // for the server's life); a stale latch only wakes someone spuriously. SetLatch never
            // raises: safe in a commit callback.
            unsafe {
                let proc_ = (*pg_sys::ProcGlobal).allProcs.add(procno as usize);
                pg_sys::SetLatch(&raw mut (*proc_).procLatch);
            }
        }
    }
}
