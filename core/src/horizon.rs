//! The horizon: the highest position below which every publishing transaction
//! has finished. Pure logic, unit-tested without a server.
//!
//! # The invariant
//!
//! Once a reader has seen position `p`, no event with a position below `p` may
//! appear later. Positions are handed out by a sequence at publish time, but a
//! transaction becomes visible at commit, in any order. So readers only look at
//! positions up to the horizon, and the horizon only passes a position once the
//! transaction that may hold it has finished.
//!
//! # Why it holds
//!
//! A publishing backend marks its shared slot as "allocating" *before* it takes
//! its first position, then stores that position; it clears the slot only at
//! commit or abort, after the transaction became visible or dead.
//!
//! The worker first reads the newest allocated position `max_allocated`, *then*
//! reads every slot, waiting out any that are still allocating. Any position
//! `p <= max_allocated` was allocated before that read, so its slot was marked
//! before it too, and the slot scan sees either the slot or its clearing. Hence
//! every position up to `min(max_allocated, lowest held - 1)` belongs to a
//! finished transaction. The worker then takes a new snapshot, which sees every
//! one of those commits, and persists the horizon in the transaction that
//! delivers the events: a reader whose snapshot sees the horizon sees all the
//! events below it, under any isolation level.

/// The new horizon, given the newest allocated position (read first) and the
/// lowest position of each open publishing transaction (read after it).
pub fn compute(max_allocated: u64, held: impl IntoIterator<Item = u64>) -> u64 {
    held.into_iter().map(|low| low.saturating_sub(1)).fold(max_allocated, u64::min)
}

/// Who holds the horizon back: the open transaction with the lowest position,
/// if that position is at or below the newest allocated one.
pub fn holder<K>(max_allocated: u64, held: impl IntoIterator<Item = (K, u64)>) -> Option<(K, u64)> {
    held.into_iter().filter(|(_, low)| *low <= max_allocated).min_by_key(|(_, low)| *low)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_open_publishers_means_everything_allocated_is_final() {
        assert_eq!(compute(42, []), 42);
        assert_eq!(compute(0, []), 0);
    }

    #[test]
    fn an_open_publisher_holds_the_horizon_below_its_first_position() {
        // A took 10 and is open; B took 11 and committed: 11 must wait for A.
        assert_eq!(compute(11, [10]), 9);
        assert_eq!(compute(20, [15, 12]), 11);
    }

    #[test]
    fn slots_above_the_allocated_range_do_not_matter() {
        // Allocated after the worker read max_allocated: beyond the horizon anyway.
        assert_eq!(compute(30, [31, 40]), 30);
    }

    #[test]
    fn a_publisher_at_position_one_holds_everything() {
        assert_eq!(compute(5, [1]), 0);
    }

    #[test]
    fn holder_is_the_lowest_slot_within_the_allocated_range() {
        let slots = [(1, 12), (2, 9), (3, 50)];
        assert_eq!(holder(20, slots), Some((2, 9)));
        assert_eq!(holder(5, slots), None);
    }

    /// Replays random interleavings of allocate / commit / abort against the
    /// protocol and checks the invariant: every position at or below a
    /// computed horizon belongs to a finished transaction.
    #[test]
    fn horizon_never_passes_an_unfinished_transaction() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..200 {
            let mut allocated = 0u64;
            let mut open: Vec<(u64, Vec<u64>)> = Vec::new(); // (slot low, positions)
            let mut finished = std::collections::BTreeSet::new();
            let mut horizon = 0u64;
            for _ in 0..300 {
                match next() % 3 {
                    0 => {
                        // a new transaction: slot first, then its positions
                        let n = 1 + next() % 3;
                        let positions: Vec<u64> = (0..n)
                            .map(|_| {
                                allocated += 1;
                                allocated
                            })
                            .collect();
                        open.push((positions[0], positions));
                    }
                    1 if !open.is_empty() => {
                        let (_, positions) = open.swap_remove((next() as usize) % open.len());
                        finished.extend(positions);
                    }
                    _ => {
                        let h = compute(allocated, open.iter().map(|(low, _)| *low));
                        assert!(h >= horizon, "the horizon never moves back");
                        assert!((1..=h).all(|p| finished.contains(&p)), "horizon {h} passed an open position");
                        horizon = h;
                    }
                }
            }
        }
    }
}
