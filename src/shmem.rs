//! The state shared between publishers, consumers and workers: one slot per
//! backend for open publishing transactions, one per backend for what its
//! subscription polls claim and wait for, and one entry per database for its
//! worker.
//!
//! Everything here is a plain atomic, so publishers' commit callbacks can touch
//! it without locks or allocation. The slots are indexed by `pgprocno`, so each
//! backend owns its slot exclusively; a database entry is claimed once per
//! database under a spinlock and kept until the server restarts.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU32, AtomicU64, Ordering};

use pgrx::pg_sys;

/// A slot's value while its backend is taking its first position.
const ALLOCATING: u64 = u64::MAX;

/// One backend's open publishing transaction. `low == 0`: none.
#[repr(C)]
pub struct PublisherSlot {
    db: AtomicU32,
    low: AtomicU64,
    /// When the transaction announced itself (TimestampTz), for hold_timeout.
    since: AtomicI64,
    /// The announcing backend's pid, for hold_timeout.
    pid: AtomicI32,
}

/// How many subscriptions one backend's transaction reports claims for in
/// `streams.subscriptions` (it may claim from more; they are not counted).
pub const CLAIMS_SHOWN: usize = 4;

/// One backend's subscription polls: the database whose horizon it waits
/// for, and how many events its open transaction claimed, per subscription.
/// Written only by its backend; read by the worker (waiters) and by
/// `streams.subscriptions` (claims).
#[repr(C)]
pub struct ConsumerSlot {
    /// The database a long poll waits in, 0 when none.
    waiting_db: AtomicU32,
    /// The subscription it polls (0: `streams.wait`, the horizon only).
    waiting_subscription: AtomicI32,
    claim_db: AtomicU32,
    /// Subscription ids (0: unused) and their claimed event counts.
    claim_subscription: [AtomicI32; CLAIMS_SHOWN],
    claim_count: [AtomicI64; CLAIMS_SHOWN],
}

/// What the worker of one database publishes about itself.
#[repr(C)]
pub struct DbEntry {
    db: AtomicU32,
    /// pid of the worker serving this database, 0 when none.
    pub worker_pid: AtomicI32,
    /// pgprocno of that worker, -1 when none: publishers set its latch.
    worker_procno: AtomicI32,
    /// Set by publishers at commit, cleared by the worker before each round.
    pub wake: AtomicBool,
    /// Set by a backend about to DROP DATABASE: the worker leaves for good.
    pub stop: AtomicBool,
    /// The worker's persisted horizon.
    pub horizon: AtomicU64,
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
    /// pid of the webhook worker serving this database, 0 when none.
    pub webhook_pid: AtomicI32,
    /// A transaction that created or resumed a webhook committed: the
    /// database's worker starts the webhook worker if none runs.
    pub webhooks_wanted: AtomicBool,
    /// pgprocno of that worker, -1 when none.
    webhook_procno: AtomicI32,
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

#[repr(C)]
struct Header {
    n_slots: u32,
    n_dbs: u32,
    db_lock: AtomicBool,
    /// Bumped when a transaction that changed stream grants commits.
    acl_generation: AtomicU64,
    /// pgprocno of the launcher, -1 when none: publishers set its latch.
    launcher_procno: AtomicI32,
    /// Databases dropped lately (0: an empty place), for workers the
    /// postmaster restarts after their database is gone (see
    /// [`remember_dropped`]).
    dropped: [AtomicU32; DROPPED_REMEMBERED],
    /// Where the next dropped database goes (modulo `DROPPED_REMEMBERED`).
    dropped_next: AtomicU32,
}

/// How many dropped databases are remembered. A worker is restarted one
/// second after it exited, so only the drops of about the last second matter.
const DROPPED_REMEMBERED: usize = 16;

static mut SHARED: *mut Header = std::ptr::null_mut();
static mut PREV_REQUEST_HOOK: pg_sys::shmem_request_hook_type = None;
static mut PREV_STARTUP_HOOK: pg_sys::shmem_startup_hook_type = None;

const SHMEM_NAME: &std::ffi::CStr = c"litebase_streams";

/// Slot count and database-entry count, from the server's settings.
fn dimensions() -> (u32, u32) {
    // pgprocno covers backends, auxiliary processes and prepared transactions;
    // the margin covers the auxiliary processes.
    // SAFETY: plain reads of settings fixed at server start; only the shmem hooks call this, after
    // the postmaster computed MaxBackends.
    let (backends, workers) = unsafe { (pg_sys::MaxBackends, pg_sys::max_worker_processes) };
    let prepared = crate::pg_decls::max_prepared_xacts();
    ((backends + prepared + 16) as u32, workers.max(1) as u32)
}

/// Offsets of the database entries, the publisher slots and the consumer
/// slots, and the total size.
fn layout(n_slots: u32, n_dbs: u32) -> (usize, usize, usize, usize) {
    let header = std::mem::size_of::<Header>().next_multiple_of(64);
    let dbs = n_dbs as usize * std::mem::size_of::<DbEntry>();
    let slots = n_slots as usize * std::mem::size_of::<PublisherSlot>();
    let consumers = n_slots as usize * std::mem::size_of::<ConsumerSlot>();
    (header, header + dbs, header + dbs + slots, header + dbs + slots + consumers)
}

/// Install the shared-memory hooks. Call only from `_PG_init` while
/// `shared_preload_libraries` is being processed.
///
/// # Safety
/// SAFETY: call only from `_PG_init` during shared_preload_libraries: the postmaster is then
/// single-threaded, so the `static mut` hook slots have no concurrent reader.
pub unsafe fn init() {
    PREV_REQUEST_HOOK = pg_sys::shmem_request_hook;
    pg_sys::shmem_request_hook = Some(request_hook);
    PREV_STARTUP_HOOK = pg_sys::shmem_startup_hook;
    pg_sys::shmem_startup_hook = Some(startup_hook);
}

/// # Safety
/// SAFETY: installed by [`init`]; PostgreSQL calls it once, in the single-threaded postmaster.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn request_hook() {
    if let Some(prev) = PREV_REQUEST_HOOK {
        prev();
    }
    let (n_slots, n_dbs) = dimensions();
    pg_sys::RequestAddinShmemSpace(layout(n_slots, n_dbs).3);
}

/// # Safety
/// SAFETY: installed by [`init`]; runs in the postmaster before any child is forked, so the region
/// from ShmemInitStruct (the size requested above) is initialised before anyone reads it.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn startup_hook() {
    if let Some(prev) = PREV_STARTUP_HOOK {
        prev();
    }
    let (n_slots, n_dbs) = dimensions();
    let size = layout(n_slots, n_dbs).3;
    let mut found = false;
    let base = pg_sys::ShmemInitStruct(SHMEM_NAME.as_ptr(), size, &mut found);
    if !found {
        std::ptr::write_bytes(base as *mut u8, 0, size);
        let header = base as *mut Header;
        (*header).n_slots = n_slots;
        (*header).n_dbs = n_dbs;
        for entry in db_entries_of(header) {
            entry.worker_procno.store(-1, Ordering::Relaxed);
            entry.webhook_procno.store(-1, Ordering::Relaxed);
        }
        (*header).launcher_procno.store(-1, Ordering::Relaxed);
    }
    SHARED = base as *mut Header;
}

/// Whether the shared state exists (the library was preloaded).
pub fn available() -> bool {
    // SAFETY: SHARED is written only by the postmaster's startup hook, before any backend forks.
    unsafe { !SHARED.is_null() }
}

fn header() -> *mut Header {
    // SAFETY: SHARED is written only by the postmaster's startup hook, before any backend forks.
    let header = unsafe { SHARED };
    assert!(!header.is_null(), "litebase_streams shared memory is not initialised");
    header
}

fn db_entries_of(header: *mut Header) -> &'static [DbEntry] {
    // SAFETY: `header` is the ShmemInitStruct region (header() or the startup hook), which lives as
    // long as the server; the entries follow it at layout()'s offset, n_dbs is written before use.
    unsafe {
        let base = (header as *mut u8).add(layout(0, 0).0) as *const DbEntry;
        std::slice::from_raw_parts(base, (*header).n_dbs as usize)
    }
}

fn slots() -> &'static [PublisherSlot] {
    let header = header();
    // SAFETY: header() is the ShmemInitStruct region, live as long as the server and sized by the
    // request hook with the same layout(); n_slots and n_dbs never change after startup.
    unsafe {
        let (_, offset, _, _) = layout((*header).n_slots, (*header).n_dbs);
        let base = (header as *mut u8).add(offset) as *const PublisherSlot;
        std::slice::from_raw_parts(base, (*header).n_slots as usize)
    }
}

fn consumer_slots() -> &'static [ConsumerSlot] {
    let header = header();
    // SAFETY: as in slots(): the consumer slots follow the publisher slots at layout()'s offset.
    unsafe {
        let (_, _, offset, _) = layout((*header).n_slots, (*header).n_dbs);
        let base = (header as *mut u8).add(offset) as *const ConsumerSlot;
        std::slice::from_raw_parts(base, (*header).n_slots as usize)
    }
}

/// This backend's consumer slot.
pub fn my_consumer_slot() -> Option<&'static ConsumerSlot> {
    // SAFETY: MyProcNumber's PG15 form: MyProc is set once the backend is connected.
    let procno = unsafe { (*pg_sys::MyProc).pgprocno };
    consumer_slots().get(usize::try_from(procno).ok()?)
}

impl ConsumerSlot {
    /// Wait for database `db`'s horizon and, if not 0, for claims of
    /// `subscription` to be returned (db 0: stop waiting).
    pub fn wait_in(&self, db: u32, subscription: i32) {
        self.waiting_subscription.store(subscription, Ordering::SeqCst);
        self.waiting_db.store(db, Ordering::SeqCst);
    }

    /// Report `count` events claimed from `subscription` in database `db`
    /// (0: none). Atomics only: runs inside commit callbacks.
    pub fn report_claims(&self, db: u32, subscription: i32, count: i64) {
        self.claim_db.store(db, Ordering::Relaxed);
        let entries = self.claim_subscription.iter().zip(&self.claim_count);
        for (sub, claimed) in entries.clone() {
            if sub.load(Ordering::Relaxed) == subscription {
                claimed.store(count, Ordering::Relaxed);
                if count == 0 {
                    sub.store(0, Ordering::Relaxed);
                }
                return;
            }
        }
        if count > 0 {
            if let Some((sub, claimed)) = entries.into_iter().find(|(sub, _)| sub.load(Ordering::Relaxed) == 0) {
                claimed.store(count, Ordering::Relaxed);
                sub.store(subscription, Ordering::Relaxed);
            }
        }
    }

    /// The transaction ended: nothing is claimed. Atomics only.
    pub fn clear_claims(&self) {
        for sub in &self.claim_subscription {
            sub.store(0, Ordering::Relaxed);
        }
    }
}

/// Set the latch of every backend that waits in database `db`: for its
/// horizon (the worker, after each round that moved it), or, with
/// `subscriptions`, only those polling one of them (a transaction that
/// held their claims ended). Atomics and `SetLatch` only.
pub fn wake_pollers(db: pg_sys::Oid, subscriptions: Option<&[i32]>) {
    if !available() {
        return;
    }
    for (procno, slot) in consumer_slots().iter().enumerate() {
        if slot.waiting_db.load(Ordering::SeqCst) != db.to_u32() {
            continue;
        }
        let polled = slot.waiting_subscription.load(Ordering::SeqCst);
        if subscriptions.is_some_and(|subs| !subs.contains(&polled)) {
            continue;
        }
        // SAFETY: ProcGlobal's allProcs lives as long as the server and has a
        // PGPROC for every pgprocno the slots are sized for; SetLatch never raises.
        unsafe {
            let proc_ = (*pg_sys::ProcGlobal).allProcs.add(procno);
            pg_sys::SetLatch(&raw mut (*proc_).procLatch);
        }
    }
}

/// (subscription, pid, claimed events) of every open transaction in `db`
/// that claimed events, for `streams.subscriptions`.
pub fn claims_in(db: pg_sys::Oid) -> Vec<(i32, i32, i64)> {
    let mut found = Vec::new();
    for (procno, slot) in consumer_slots().iter().enumerate() {
        if slot.claim_db.load(Ordering::Relaxed) != db.to_u32() {
            continue;
        }
        for (sub, claimed) in slot.claim_subscription.iter().zip(&slot.claim_count) {
            let (sub, claimed) = (sub.load(Ordering::Relaxed), claimed.load(Ordering::Relaxed));
            if sub != 0 && claimed > 0 {
                found.push((sub, pid_of(procno), claimed));
            }
        }
    }
    found
}

/// The current generation of stream grants (see privileges.rs).
pub fn acl_generation() -> u64 {
    // SAFETY: header() points into shared memory that lives as long as the server; an atomic load.
    unsafe { (*header()).acl_generation.load(Ordering::Acquire) }
}

/// Invalidate every backend's cached publish answers. Atomics only.
pub fn bump_acl_generation() {
    if available() {
        // SAFETY: ShmemInitStruct memory (available() above); atomics only: safe at commit.
        unsafe { (*header()).acl_generation.fetch_add(1, Ordering::AcqRel) };
    }
}

/// Record the launcher's pgprocno so publishers can wake it.
pub fn set_launcher(procno: i32) {
    // SAFETY: header() points into shared memory that lives as long as the server; an atomic store.
    unsafe { (*header()).launcher_procno.store(procno, Ordering::Release) };
}

/// Wake the launcher. Atomics and `SetLatch` only.
pub fn wake_launcher() {
    // SAFETY: header() points into shared memory that lives as long as the server; an atomic load.
    let procno = unsafe { (*header()).launcher_procno.load(Ordering::Acquire) };
    if procno >= 0 {
        // SAFETY: a pgprocno the launcher recorded; PGPROC entries live as
        // long as the server, so a stale one (the launcher exited) only sets
        // an unused latch: a spurious wake-up at worst. SetLatch never fails.
        unsafe {
            let proc_ = (*pg_sys::ProcGlobal).allProcs.add(procno as usize);
            pg_sys::SetLatch(&raw mut (*proc_).procLatch);
        }
    }
}

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
    db_entries_of(header()).iter().find(|e| e.db.load(Ordering::Acquire) == db.to_u32())
}

/// The entry of database `db`, claiming a free one if needed. `None` when the
/// table is full (more databases than `max_worker_processes`).
pub fn claim_db(db: pg_sys::Oid) -> Option<&'static DbEntry> {
    with_db_lock(|entries| find_or_claim(entries, db))
}

/// Run `f` on the database entries while holding the lock that makes
/// claiming, attaching and freeing an entry one step each.
fn with_db_lock<T>(f: impl FnOnce(&'static [DbEntry]) -> T) -> T {
    let header = header();
    // SAFETY: header() is shared memory that lives as long as the server; db_lock is an AtomicBool.
    let lock = unsafe { &(*header).db_lock };
    while lock.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
        std::hint::spin_loop();
    }
    let result = f(db_entries_of(header));
    lock.store(false, Ordering::Release);
    result
}

fn find_or_claim(entries: &'static [DbEntry], db: pg_sys::Oid) -> Option<&'static DbEntry> {
    entries.iter().find(|e| e.db.load(Ordering::Acquire) == db.to_u32()).or_else(|| {
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
            entry.needs_worker.store(false, Ordering::Release);
            entry.no_slot.store(false, Ordering::Release);
        }
        Attach::Attached(entry)
    })
}

/// The `server` process `pid` leaves `entry` (at its exit). The entry is
/// freed for another database once nothing needs it: no worker of either
/// kind, no publisher asking for one, no DROP DATABASE waiting (which frees
/// it itself). So a database whose extension was dropped, or that became a
/// template, gives its entry back; the next publish or CREATE EXTENSION
/// claims one again.
pub fn detach(entry: &DbEntry, server: Server, pid: i32) {
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
        let unused = entry.worker_pid.load(Ordering::Acquire) == 0
            && entry.webhook_pid.load(Ordering::Acquire) == 0
            && !entry.needs_worker.load(Ordering::Acquire)
            && !entry.stop.load(Ordering::Acquire);
        if unused {
            entry.forget();
        }
    })
}

impl DbEntry {
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
        self.newest.store(0, Ordering::Relaxed);
        self.rounds.store(0, Ordering::Relaxed);
        self.state.store(WorkerState::Starting as u32, Ordering::Relaxed);
        self.webhooks_wanted.store(false, Ordering::Relaxed);
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

/// This backend's publisher slot.
pub fn my_slot(procno: i32) -> Option<&'static PublisherSlot> {
    slots().get(usize::try_from(procno).ok()?)
}

impl PublisherSlot {
    /// Announce a first publish in database `db`: a position is being taken.
    pub fn begin(&self, db: pg_sys::Oid) {
        // SAFETY: plain reads of this backend's statement start time and of MyProcPid, which is set
        // once at process start and only read here.
        self.since.store(unsafe { pg_sys::GetCurrentStatementStartTimestamp() }, Ordering::Relaxed);
        self.pid.store(unsafe { pg_sys::MyProcPid }, Ordering::Relaxed);
        self.db.store(db.to_u32(), Ordering::SeqCst);
        self.low.store(ALLOCATING, Ordering::SeqCst);
    }

    /// The first position is known: hold exactly it.
    pub fn hold(&self, position: u64) {
        self.low.store(position, Ordering::SeqCst);
    }

    /// The transaction finished. Atomics only: runs inside commit callbacks.
    pub fn release(&self) {
        self.low.store(0, Ordering::SeqCst);
    }
}

/// The lowest position held by each open publishing transaction of database
/// `db`, keyed by pgprocno. A backend still taking its first position is
/// usually a few instructions from knowing it (or from withdrawing): wait
/// briefly, since whatever it gets may be below the caller's reading of the
/// sequence. One that stays allocating (its `nextval` waits on a lock) counts
/// as holding everything ([`HOLDS_EVERYTHING`]): the horizon does not move
/// this round, and nobody waits on it.
pub fn held_positions(db: pg_sys::Oid) -> Vec<(usize, u64)> {
    let mut found = Vec::new();
    for (procno, slot) in slots().iter().enumerate() {
        let mut low = slot.low.load(Ordering::SeqCst);
        if low == 0 || slot.db.load(Ordering::SeqCst) != db.to_u32() {
            continue;
        }
        let mut spins = 0u32;
        while low == ALLOCATING && spins < 1100 {
            spins += 1;
            if spins < 1000 {
                std::hint::spin_loop();
            } else {
                // SAFETY: a plain sleep of 10 µs; at most 100 of them per slot.
                unsafe { pg_sys::pg_usleep(10) };
            }
            low = slot.low.load(Ordering::SeqCst);
        }
        match low {
            0 => {}
            ALLOCATING => found.push((procno, HOLDS_EVERYTHING)),
            low => found.push((procno, low)),
        }
    }
    found
}

/// The lowest position held by an open publishing transaction of `db`,
/// passing over backends still taking their first one (they will get a
/// position above every one taken so far); without waiting.
pub fn lowest_position_held(db: pg_sys::Oid) -> Option<u64> {
    slots()
        .iter()
        .filter(|slot| slot.db.load(Ordering::SeqCst) == db.to_u32())
        .map(|slot| slot.low.load(Ordering::SeqCst))
        .filter(|&low| low != 0 && low != ALLOCATING)
        .min()
}

/// The position reported for a slot still allocating after the wait.
pub const HOLDS_EVERYTHING: u64 = 1;

/// The pid and start time (TimestampTz) of the open publishing transaction
/// in slot `procno` while it still holds position `low`.
pub fn holder_of(procno: usize, low: u64) -> Option<(i32, i64)> {
    let slot = slots().get(procno)?;
    let (pid, since) = (slot.pid.load(Ordering::Relaxed), slot.since.load(Ordering::Relaxed));
    // Read after pid and since: a slot reused since the scan shows a new low.
    (slot.low.load(Ordering::SeqCst) == low && low != 0).then_some((pid, since))
}

/// The process with this pgprocno, or None for one out of range.
fn proc_at(procno: usize) -> Option<*const pg_sys::PGPROC> {
    // SAFETY: ProcGlobal and its allProcs array live in shared memory as long
    // as the server; the index is checked against allProcCount.
    unsafe {
        let global = pg_sys::ProcGlobal;
        (procno < (*global).allProcCount as usize).then(|| (*global).allProcs.add(procno) as *const pg_sys::PGPROC)
    }
}

/// The pid of the process with this pgprocno (0 for one out of range).
pub fn pid_of(procno: usize) -> i32 {
    // SAFETY: proc_at points into shared memory that lives as long as the server.
    proc_at(procno).map_or(0, |proc_| unsafe { (*proc_).pid })
}

/// The top transaction id of the process with this pgprocno (invalid for
/// one out of range or not in a transaction). Read without a lock: it may
/// already be the id of the transaction the process runs next.
pub fn xid_of(procno: usize) -> pg_sys::TransactionId {
    // SAFETY: proc_at points into shared memory that lives as long as the
    // server; a volatile read, since the process changes it concurrently.
    proc_at(procno).map_or(pg_sys::InvalidTransactionId, |proc_| unsafe { std::ptr::read_volatile(&(*proc_).xid) })
}
