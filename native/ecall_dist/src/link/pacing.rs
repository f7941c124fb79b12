//! When a link's writer gathers: the decision made after each pass and
//! each sleep, apart from the I/O so that it can be tested alone. The
//! writer (`link/writer.rs`) tells it what happened and asks it before a
//! pass whether to wait for company first; `may_gather` there does the
//! waiting.
//!
//! - A pass that wrote [`GATHER_AFTER`] requests or more, or a sleep that a
//!   push ended within [`BUSY_SLEEP`], makes the next pass gather: the
//!   link is busy.
//! - Unless the link is sparse: a gathering wait that ran its full length
//!   and brought fewer than [`SPARSE_BELOW`] requests stops gathering for
//!   [`SPARSE_FOR`]. Ended early by a pass of `SPARSE_BELOW` requests, or
//!   by a pass of `GATHER_AFTER` right after another pass (they came while
//!   that one wrote: a burst).

use super::{BUSY_SLEEP, GATHER_AFTER, SPARSE_BELOW, SPARSE_FOR};
use std::time::Duration;

/// The writer's pacing state. Times are `side::clock` nanoseconds.
#[derive(Debug, Default)]
pub(super) struct Pacing {
    /// Whether the next pass gathers first.
    gather: bool,
    /// Whether the last thing the writer did was a pass (no sleep or
    /// gathering wait since).
    after_pass: bool,
    /// Until when the link is sparse.
    sparse_until: u64,
}

impl Pacing {
    /// Before a pass: whether to wait for company first (asked once).
    pub(super) fn take_gather(&mut self) -> bool {
        std::mem::take(&mut self.gather)
    }

    /// A gathering wait ended.
    pub(super) fn gathered(&mut self) {
        self.after_pass = false;
    }

    /// A pass wrote `n` requests at `now`; `waited_out`: right after a
    /// gathering wait that ran its full length (what it took is all the
    /// company there was). The writer says false for a wait that callers
    /// blocked on the byte budget could not fill.
    pub(super) fn passed(&mut self, n: u64, waited_out: bool, now: u64) {
        if n >= SPARSE_BELOW || (self.after_pass && n >= GATHER_AFTER) {
            self.sparse_until = 0;
        } else if waited_out {
            self.sparse_until = now.saturating_add(nanos(SPARSE_FOR));
        }
        self.gather = n >= GATHER_AFTER && !self.is_sparse(now);
        self.after_pass = true;
    }

    /// The writer slept `slept` and a push (or a tick, or the reader) woke
    /// it at `now`.
    pub(super) fn slept(&mut self, slept: Duration, now: u64) {
        self.after_pass = false;
        self.gather = slept < BUSY_SLEEP && !self.is_sparse(now);
    }

    /// Whether the link is sparse at `now`.
    pub(super) fn is_sparse(&self, now: u64) -> bool {
        now < self.sparse_until
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const SOON: Duration = Duration::from_micros(50);

    /// A closed loop of one sender: each request wakes the writer soon
    /// after it fell asleep. The first gathers; its wait brings nothing,
    /// so the link turns sparse and the next ones do not wait, until
    /// SPARSE_FOR has passed and a wait looks again.
    #[test]
    fn a_wait_that_brings_nothing_stops_gathering_for_a_while() {
        let mut p = Pacing::default();
        p.slept(SOON, MS);
        assert!(p.take_gather());
        p.gathered();
        p.passed(1, true, 2 * MS);
        assert!(p.is_sparse(2 * MS));
        for i in 0..50 {
            let now = 3 * MS + i * MS;
            p.slept(SOON, now);
            assert!(!p.take_gather(), "gathered at {i}");
            p.passed(1, false, now);
        }
        // Still one request per pass: sparse until its time is up.
        let later = 2 * MS + nanos(SPARSE_FOR);
        p.slept(SOON, later);
        assert!(p.take_gather());
    }

    /// A paced load between bursts: a wait in a gap brings little and
    /// turns the link sparse, but the next burst (requests piling up while
    /// a pass writes) ends that at once, and gathering is back.
    #[test]
    fn a_burst_ends_sparseness() {
        let mut p = Pacing::default();
        p.slept(SOON, MS);
        assert!(p.take_gather());
        p.gathered();
        p.passed(3, true, 2 * MS);
        assert!(p.is_sparse(2 * MS));
        p.slept(SOON, 3 * MS);
        assert!(!p.take_gather());
        // Pass, then another right away with what came meanwhile.
        p.passed(2, false, 3 * MS);
        assert!(p.is_sparse(3 * MS));
        p.passed(GATHER_AFTER, false, 3 * MS);
        assert!(!p.is_sparse(3 * MS));
        assert!(p.take_gather());
    }

    /// A big pass ends it too, even after a sleep.
    #[test]
    fn a_full_pass_ends_sparseness() {
        let mut p = Pacing::default();
        p.gathered();
        p.passed(1, true, MS);
        p.slept(SOON, 2 * MS);
        p.passed(SPARSE_BELOW, false, 2 * MS);
        assert!(!p.is_sparse(2 * MS));
        assert!(p.take_gather());
    }

    /// A wait cut short (an urgent push, or a shard that filled) says
    /// nothing about company: no sparseness from it. Nor from a pass of
    /// GATHER_AFTER after a sleep, which is not a burst.
    #[test]
    fn only_a_full_wait_makes_a_link_sparse() {
        let mut p = Pacing::default();
        p.gathered();
        p.passed(1, false, MS);
        assert!(!p.is_sparse(MS));
        p.gathered();
        p.passed(SPARSE_BELOW - 1, true, MS);
        assert!(p.is_sparse(MS));
        p.slept(SOON, 2 * MS);
        p.passed(GATHER_AFTER, false, 2 * MS);
        assert!(p.is_sparse(2 * MS), "one pass after a sleep is no burst");
    }

    /// Without sparseness, the rules of a busy link as before: a pass of
    /// GATHER_AFTER or a sleep shorter than BUSY_SLEEP gathers; a long
    /// sleep or a small pass does not.
    #[test]
    fn busy_links_gather() {
        let mut p = Pacing::default();
        p.passed(GATHER_AFTER, false, MS);
        assert!(p.take_gather());
        assert!(!p.take_gather(), "asked once");
        p.passed(GATHER_AFTER - 1, false, MS);
        assert!(!p.take_gather());
        p.slept(BUSY_SLEEP, MS);
        assert!(!p.take_gather());
        p.slept(SOON, MS);
        assert!(p.take_gather());
    }
}
