//! When a link's writer gathers: the decision made after each pass and
//! each sleep, apart from the I/O so that it can be tested alone. The
//! writer (`link/writer.rs`) tells it what happened and asks it before a
//! pass whether to wait for company first; `may_gather` there does the
//! waiting.
//!
//! A pass that wrote [`GATHER_AFTER`] requests or more, or a sleep that a
//! push ended within [`BUSY_SLEEP`], makes the next pass gather: the link
//! is busy. Anything else makes it write what comes at once.

use super::{BUSY_SLEEP, GATHER_AFTER};
use std::time::Duration;

/// The writer's pacing state.
#[derive(Debug, Default)]
pub(super) struct Pacing {
    /// Whether the next pass gathers first.
    gather: bool,
}

impl Pacing {
    /// Before a pass: whether to wait for company first (asked once).
    pub(super) fn take_gather(&mut self) -> bool {
        std::mem::take(&mut self.gather)
    }

    /// A pass wrote `n` requests.
    pub(super) fn passed(&mut self, n: u64) {
        self.gather = n >= GATHER_AFTER;
    }

    /// The writer slept `slept` before a push (or a tick, or the reader)
    /// woke it.
    pub(super) fn slept(&mut self, slept: Duration) {
        self.gather = slept < BUSY_SLEEP;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOON: Duration = Duration::from_micros(50);

    /// A pass of GATHER_AFTER or a sleep shorter than BUSY_SLEEP gathers;
    /// a long sleep or a small pass does not; each decision is asked for
    /// once.
    #[test]
    fn busy_links_gather() {
        let mut p = Pacing::default();
        assert!(!p.take_gather(), "a new link writes at once");
        p.passed(GATHER_AFTER);
        assert!(p.take_gather());
        assert!(!p.take_gather(), "asked once");
        p.passed(GATHER_AFTER - 1);
        assert!(!p.take_gather());
        p.slept(BUSY_SLEEP);
        assert!(!p.take_gather());
        p.slept(SOON);
        assert!(p.take_gather());
    }

    /// The last event decides: a busy pass followed by a long sleep does
    /// not gather, a quick wake-up after a small pass does.
    #[test]
    fn the_last_event_decides() {
        let mut p = Pacing::default();
        p.passed(GATHER_AFTER * 10);
        p.slept(BUSY_SLEEP * 10);
        assert!(!p.take_gather());
        p.passed(1);
        p.slept(SOON);
        assert!(p.take_gather());
    }
}
