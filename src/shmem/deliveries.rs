//! One mailbox per backend for recording a poll's deliveries durably before
//! the poll returns them.
//!
//! A transaction-scoped poll hands events to a transaction that may roll
//! back, lose its session or die with the server: whatever it writes goes
//! with it. The attempt count must survive all of that, so the poller asks
//! its database's worker to write the delivery in a transaction of the
//! worker's own, and waits for that commit (flushed, like every commit of
//! the worker) before it returns the events. The poller writes its request
//! here and sets the worker's latch; the worker copies the request, commits
//! it, stores the sequence number in `done` and sets the poller's latch.
//!
//! A request is published by its sequence number: the poller writes the
//! fields, then `requested` (release); the worker reads `requested`, copies
//! the fields, and reads `requested` again: if it changed, the poller gave
//! up on that request (a cancel) and wrote a new one, and the copy is
//! dropped. Atomics only.

use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU32, AtomicU64, Ordering};

use pgrx::pg_sys;

use super::{available, mailboxes};

/// The most ranges one request carries (one poll of an unordered
/// subscription claims at most 16 chunks).
pub const DELIVERY_RANGES: usize = 16;

/// A backend's request to record deliveries, and the worker's answer.
#[repr(C)]
pub struct DeliveryMailbox {
    db: AtomicU32,
    subscription: AtomicI32,
    /// The backend's pid and start time: who the events went to.
    pid: AtomicI32,
    started: AtomicI64,
    len: AtomicU32,
    /// The lease the events are claimed under (0: none) and for how long.
    lease: AtomicI64,
    lease_us: AtomicI64,
    /// `(after, through]` ranges of positions.
    ranges: [[AtomicI64; 2]; DELIVERY_RANGES],
    /// The sequence number of the request written last.
    requested: AtomicU64,
    /// The last request the worker committed.
    done: AtomicU64,
    /// The last request the worker could not commit (the server log says why).
    failed: AtomicU64,
    /// The last request the worker left unwritten because another
    /// transaction holds the attempt records it would change.
    blocked: AtomicU64,
}

/// A request copied out of a mailbox.
#[derive(Debug, Clone)]
pub struct DeliveryRequest {
    pub procno: usize,
    pub sequence: u64,
    pub subscription: i32,
    pub pid: i32,
    pub started: i64,
    /// `(lease id, microseconds)` when the events are leased.
    pub lease: Option<(i64, i64)>,
    pub ranges: Vec<(i64, i64)>,
}

/// What became of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryAnswer {
    Pending,
    Done,
    Failed,
    /// Not written: another transaction (the poller's own, when it settled
    /// or nacked the same events) holds attempt records it would change.
    /// The worker does not wait for row locks: one blocked request must not
    /// hold up every poller of the database.
    Blocked,
}

/// This backend's mailbox.
pub fn my_mailbox() -> Option<&'static DeliveryMailbox> {
    // SAFETY: MyProc is set once the backend is connected.
    let procno = unsafe { (*pg_sys::MyProc).pgprocno };
    mailboxes().get(usize::try_from(procno).ok()?)
}

impl DeliveryMailbox {
    /// Write a request and return its sequence number.
    pub fn request(
        &self,
        db: u32,
        subscription: i32,
        (pid, started): (i32, i64),
        lease: Option<(i64, i64)>,
        ranges: &[(i64, i64)],
    ) -> u64 {
        assert!(ranges.len() <= DELIVERY_RANGES, "at most {DELIVERY_RANGES} ranges per delivery");
        self.db.store(db, Ordering::Relaxed);
        self.subscription.store(subscription, Ordering::Relaxed);
        self.pid.store(pid, Ordering::Relaxed);
        self.started.store(started, Ordering::Relaxed);
        self.len.store(ranges.len() as u32, Ordering::Relaxed);
        let (lease, lease_us) = lease.unwrap_or((0, 0));
        self.lease.store(lease, Ordering::Relaxed);
        self.lease_us.store(lease_us, Ordering::Relaxed);
        for (place, (after, through)) in self.ranges.iter().zip(ranges) {
            place[0].store(*after, Ordering::Relaxed);
            place[1].store(*through, Ordering::Relaxed);
        }
        let sequence = self.requested.load(Ordering::Relaxed).max(self.done.load(Ordering::Relaxed)) + 1;
        self.requested.store(sequence, Ordering::Release);
        sequence
    }

    pub fn answer(&self, sequence: u64) -> DeliveryAnswer {
        if self.done.load(Ordering::Acquire) >= sequence {
            DeliveryAnswer::Done
        } else if self.failed.load(Ordering::Acquire) >= sequence {
            DeliveryAnswer::Failed
        } else if self.blocked.load(Ordering::Acquire) >= sequence {
            DeliveryAnswer::Blocked
        } else {
            DeliveryAnswer::Pending
        }
    }

    /// The sequence number of the request written here last, while the
    /// worker has not answered it (None: no request waits here).
    fn waiting(&self) -> Option<u64> {
        let sequence = self.requested.load(Ordering::Acquire);
        (sequence != 0 && self.answer(sequence) == DeliveryAnswer::Pending).then_some(sequence)
    }

    /// The `(after, through]` ranges of the request written here.
    fn ranges(&self) -> impl Iterator<Item = (i64, i64)> + '_ {
        let len = (self.len.load(Ordering::Relaxed) as usize).min(DELIVERY_RANGES);
        self.ranges[..len].iter().map(|r| (r[0].load(Ordering::Relaxed), r[1].load(Ordering::Relaxed)))
    }
}

/// The requests waiting in database `db`, for its worker.
pub fn delivery_requests(db: pg_sys::Oid) -> Vec<DeliveryRequest> {
    if !available() {
        return Vec::new();
    }
    let mut found = Vec::new();
    for (procno, mailbox) in mailboxes().iter().enumerate() {
        let Some(sequence) = mailbox.waiting() else { continue };
        if mailbox.db.load(Ordering::Relaxed) != db.to_u32() {
            continue;
        }
        let ranges = mailbox.ranges().collect();
        let request = DeliveryRequest {
            procno,
            sequence,
            subscription: mailbox.subscription.load(Ordering::Relaxed),
            pid: mailbox.pid.load(Ordering::Relaxed),
            started: mailbox.started.load(Ordering::Relaxed),
            lease: match mailbox.lease.load(Ordering::Relaxed) {
                0 => None,
                lease => Some((lease, mailbox.lease_us.load(Ordering::Relaxed))),
            },
            ranges,
        };
        if mailbox.requested.load(Ordering::Acquire) == sequence {
            found.push(request);
        }
    }
    found
}

/// Whether a request for events of `subscription` (in database `db`) in
/// any of `ranges` (`(after, through]`) still waits for the worker. A
/// poller whose transaction ended while it waited (terminated, cancelled)
/// leaves its request behind, and the worker commits it after the claims
/// that covered those events are gone. A mailbox rewritten while it is read
/// counts as waiting: the caller looks again.
pub fn delivery_in_flight(db: pg_sys::Oid, subscription: i32, ranges: &[(i64, i64)]) -> bool {
    if !available() {
        return false;
    }
    // This backend's own slot too: a request of a poll of its own that
    // failed before it waited (in a savepoint), or of the backend that had
    // the slot before it, was terminated, and left it behind.
    mailboxes().iter().any(|mailbox| {
        let Some(sequence) = mailbox.waiting() else { return false };
        let overlaps = mailbox.db.load(Ordering::Relaxed) == db.to_u32()
            && mailbox.subscription.load(Ordering::Relaxed) == subscription
            && mailbox.ranges().any(|(low, high)| ranges.iter().any(|&(after, through)| low < through && after < high));
        overlaps || mailbox.requested.load(Ordering::Acquire) != sequence
    })
}

/// What became of these requests (Done, Failed or Blocked): tell their
/// backends. Atomics and `SetLatch` only.
pub fn answer_deliveries(requests: &[DeliveryRequest], outcome: DeliveryAnswer) {
    let boxes = mailboxes();
    for request in requests {
        let Some(mailbox) = boxes.get(request.procno) else { continue };
        let answer = match outcome {
            DeliveryAnswer::Done => &mailbox.done,
            DeliveryAnswer::Failed => &mailbox.failed,
            DeliveryAnswer::Blocked => &mailbox.blocked,
            DeliveryAnswer::Pending => continue,
        };
        answer.fetch_max(request.sequence, Ordering::AcqRel);
        // SAFETY: ProcGlobal's allProcs has a PGPROC for every pgprocno the
        // mailboxes are sized for; SetLatch never raises.
        unsafe {
            let proc_ = (*pg_sys::ProcGlobal).allProcs.add(request.procno);
            pg_sys::SetLatch(&raw mut (*proc_).procLatch);
        }
    }
}
