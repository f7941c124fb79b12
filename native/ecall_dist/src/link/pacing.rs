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
//! - A gathering wait that ran its full length and whose company all came
//!   in its first quarter is a *lull*: the pushes came at once, then
//!   stopped. Two in a row start a trial: the link stops gathering for
//!   [`LULL_TRIAL`], and if it wrote at least a quarter more requests per
//!   second meanwhile than while it gathered, both before the trial and
//!   for [`LULL_SAMPLE`] after it (a load that grew or shrank meanwhile
//!   beats one side only), the waits were holding its own load back (a
//!   closed loop: nothing comes back to release more requests while a
//!   wait holds them), and the link stays sparse for
//!   [`LULL_FOR`], whatever its passes bring. Otherwise batches were what
//!   paid (a paced load, whose rate is its own, or a closed loop big
//!   enough to keep the machine busy), and lulls start no trial for
//!   [`LULL_BARRED`]. Trials in a row with the same outcome double the
//!   period after them, up to 16 times. Lulls only tell when a trial may
//!   pay; the trial decides. A pass after pushes were refused for want of
//!   room in the byte budget (*crowded*) fails a trial: the peer is the
//!   bound.

use super::{
    BUSY_SLEEP, GATHER_AFTER, LULLS_IN_A_ROW, LULL_BARRED, LULL_FOR, LULL_SAMPLE, LULL_TRIAL,
    SPARSE_BELOW, SPARSE_FOR,
};
use std::time::Duration;

/// The writer's pacing state. Times are `side::clock` nanoseconds.
#[derive(Debug, Default)]
pub(super) struct Pacing {
    /// Whether the next pass gathers first.
    gather: bool,
    /// Whether the last thing the writer did was a pass (no sleep or
    /// gathering wait since).
    after_pass: bool,
    /// Until when the link is sparse ([`SPARSE_BELOW`]).
    sparse_until: u64,
    /// Where the link is with lulls.
    lull: Lulls,
}

/// Lulls and their trials (see the module's text). Rates are requests
/// written over the time since `since`.
#[derive(Debug, Clone, Copy, Default)]
struct Lulls {
    phase: Phase,
    /// Trials in a row that came out the same way: so many that paid if
    /// positive, that did not if negative. Each one more doubles the
    /// period that follows, up to [`STREAK_MAX`] times: a steady load
    /// pays for a trial (and a wrong outcome) less and less often.
    streak: i8,
}

/// The most a streak of trials doubles [`LULL_FOR`] or [`LULL_BARRED`].
const STREAK_MAX: i8 = 4;

/// Requests written in a stretch of time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rate {
    requests: u64,
    ns: u64,
}

impl Rate {
    /// Whether this rate is at least a quarter higher than `other`'s.
    fn beats(self, other: Rate) -> bool {
        // requests / ns >= 1.25 × other.requests / other.ns, in integers.
        u128::from(self.requests) * u128::from(other.ns) * 4
            >= u128::from(other.requests) * u128::from(self.ns) * 5
    }
}

/// A stretch of time being measured: `requests` written since `since`,
/// until `until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stretch {
    until: u64,
    since: u64,
    requests: u64,
}

impl Stretch {
    /// One that starts at `now` and lasts `length`.
    fn new(now: u64, length: Duration) -> Stretch {
        Stretch {
            until: now.saturating_add(nanos(length)),
            since: now,
            requests: 0,
        }
    }

    /// A pass wrote `n` requests at `now`; the rate once the stretch is
    /// over.
    fn add(&mut self, n: u64, now: u64) -> Option<Rate> {
        self.requests += n;
        (now >= self.until).then(|| Rate {
            requests: self.requests,
            ns: now.saturating_sub(self.since),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Gathering as usual since `since`, `requests` written since; the
    /// last `lulls` full waits were lulls.
    Off {
        since: u64,
        requests: u64,
        lulls: u32,
    },
    /// Not gathering for a while (`stretch`), to compare the rate with
    /// gathering's before it (`before`).
    Trial { stretch: Stretch, before: Rate },
    /// Gathering again for a while (`stretch`), to compare the trial's
    /// rate (`trial`) with gathering's after it as well: a load that was
    /// growing or shrinking meanwhile would make the trial look better
    /// than the gathering on one side of it.
    Check { stretch: Stretch, trial: Rate },
    /// The trial paid: sparse until `until`.
    On { until: u64 },
    /// The trial did not pay: lulls start no trial until `until`.
    Barred { until: u64 },
}

impl Default for Phase {
    fn default() -> Phase {
        Phase::Off {
            since: 0,
            requests: 0,
            lulls: 0,
        }
    }
}

impl Lulls {
    /// A pass wrote `n` requests at `now`, after `wait`; `crowded`: pushes
    /// were refused for want of room in the byte budget since the pass
    /// before (their callers wait for room). The peer is the bound
    /// then, and batches are what pays: not gathering would only free the
    /// room sooner for more small batches to a peer that is already behind
    /// (a blast of unpaced sends cut its batches from 148-411 to 28-88 with
    /// trials that paid there). A trial under way fails, and lulls so far
    /// do not count. Returns whether the pass decided a trial, and how
    /// (`Some(true)`: it paid).
    fn passed(&mut self, n: u64, wait: Wait, crowded: bool, now: u64) -> Option<bool> {
        let before = self.phase;
        self.phase = match self.phase {
            Phase::Off {
                since,
                requests,
                lulls,
            } => {
                let requests = requests + n;
                let lulls = match wait {
                    _ if crowded => 0,
                    Wait::None => lulls,
                    Wait::Full => 0,
                    Wait::Lull => lulls.saturating_add(1),
                };
                let ns = now.saturating_sub(since);
                if lulls >= LULLS_IN_A_ROW && ns >= nanos(LULL_SAMPLE) {
                    Phase::Trial {
                        stretch: Stretch::new(now, LULL_TRIAL),
                        before: Rate { requests, ns },
                    }
                } else {
                    Phase::Off {
                        since,
                        requests,
                        lulls,
                    }
                }
            }
            Phase::Trial { .. } | Phase::Check { .. } if crowded => self.decided(false, now),
            Phase::Trial {
                mut stretch,
                before,
            } => match stretch.add(n, now) {
                None => Phase::Trial { stretch, before },
                Some(trial) if trial.beats(before) => Phase::Check {
                    stretch: Stretch::new(now, LULL_SAMPLE),
                    trial,
                },
                Some(_) => self.decided(false, now),
            },
            Phase::Check { mut stretch, trial } => match stretch.add(n, now) {
                None => Phase::Check { stretch, trial },
                Some(after) => self.decided(trial.beats(after), now),
            },
            Phase::On { until } | Phase::Barred { until } if now >= until => Phase::Off {
                since: now,
                requests: n,
                lulls: 0,
            },
            on_or_barred => on_or_barred,
        };
        match (before, self.phase) {
            (Phase::Trial { .. } | Phase::Check { .. }, Phase::On { .. }) => Some(true),
            (Phase::Trial { .. } | Phase::Check { .. }, Phase::Barred { .. }) => Some(false),
            _ => None,
        }
    }

    /// A trial paid or did not, at `now`: what follows, for how long.
    fn decided(&mut self, paid: bool, now: u64) -> Phase {
        if paid {
            self.streak = self.streak.max(0).saturating_add(1).min(STREAK_MAX + 1);
            Phase::On {
                until: now.saturating_add(nanos(LULL_FOR) << (self.streak - 1)),
            }
        } else {
            self.streak = self.streak.min(0).saturating_sub(1).max(-STREAK_MAX - 1);
            Phase::Barred {
                until: now.saturating_add(nanos(LULL_BARRED) << (-self.streak - 1)),
            }
        }
    }

    /// The writer slept `slept` (see [`Pacing::slept`]).
    fn slept(&mut self, slept: Duration, now: u64) {
        // A link that was idle that long samples gathering anew: the idle
        // time is no part of its rate (nor is the time before its first
        // request).
        if slept >= LULL_SAMPLE && matches!(self.phase, Phase::Off { .. }) {
            self.phase = Phase::Off {
                since: now,
                requests: 0,
                lulls: 0,
            };
        }
    }

    /// Whether it keeps the link from gathering at `now`.
    fn is_sparse(&self, now: u64) -> bool {
        match self.phase {
            Phase::Trial { .. } => true,
            Phase::On { until } => now < until,
            _ => false,
        }
    }
}

/// How the wait before a pass went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wait {
    /// No gathering wait, or one cut short (an urgent push, a shard that
    /// filled): it says nothing about company.
    None,
    /// A wait that ran its full length: what the pass takes is all the
    /// company there was.
    Full,
    /// A full wait whose company all came in its first quarter.
    Lull,
}

impl Wait {
    /// A full wait from `started` to `ended` whose last push came at
    /// `last_push` (all `side::clock` nanoseconds; `last_push` before
    /// `started` if none came).
    pub(super) fn full(started: u64, ended: u64, last_push: u64) -> Wait {
        let quarter = ended.saturating_sub(started) / 4;
        if last_push < started.saturating_add(quarter) {
            Wait::Lull
        } else {
            Wait::Full
        }
    }
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

    /// A pass wrote `n` requests at `now`, after `wait`; `crowded`: pushes
    /// were refused for want of room since the pass before (see
    /// `Lulls::passed`).
    /// Returns whether it decided a lull's trial, and how (`Some(true)`: it
    /// paid).
    pub(super) fn passed(&mut self, n: u64, wait: Wait, crowded: bool, now: u64) -> Option<bool> {
        let decided = self.lull.passed(n, wait, crowded, now);
        // A wait that callers could not fill because they waited for room
        // says nothing about company: it is queued behind them.
        let wait = if crowded { Wait::None } else { wait };
        if n >= SPARSE_BELOW || (self.after_pass && n >= GATHER_AFTER) {
            self.sparse_until = 0;
        } else if wait != Wait::None {
            self.sparse_until = now.saturating_add(nanos(SPARSE_FOR));
        }
        self.gather = n >= GATHER_AFTER && !self.is_sparse(now);
        self.after_pass = true;
        decided
    }

    /// The writer slept `slept` and a push (or a tick, or the reader) woke
    /// it at `now`.
    pub(super) fn slept(&mut self, slept: Duration, now: u64) {
        self.after_pass = false;
        self.lull.slept(slept, now);
        self.gather = slept < BUSY_SLEEP && !self.is_sparse(now);
    }

    /// Whether the link is sparse at `now`.
    pub(super) fn is_sparse(&self, now: u64) -> bool {
        now < self.sparse_until || self.lull.is_sparse(now)
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
        p.passed(1, Wait::Full, false, 2 * MS);
        assert!(p.is_sparse(2 * MS));
        for i in 0..50 {
            let now = 3 * MS + i * MS;
            p.slept(SOON, now);
            assert!(!p.take_gather(), "gathered at {i}");
            p.passed(1, Wait::None, false, now);
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
        p.passed(3, Wait::Full, false, 2 * MS);
        assert!(p.is_sparse(2 * MS));
        p.slept(SOON, 3 * MS);
        assert!(!p.take_gather());
        // Pass, then another right away with what came meanwhile.
        p.passed(2, Wait::None, false, 3 * MS);
        assert!(p.is_sparse(3 * MS));
        p.passed(GATHER_AFTER, Wait::None, false, 3 * MS);
        assert!(!p.is_sparse(3 * MS));
        assert!(p.take_gather());
    }

    /// A big pass ends it too, even after a sleep.
    #[test]
    fn a_full_pass_ends_sparseness() {
        let mut p = Pacing::default();
        p.gathered();
        p.passed(1, Wait::Full, false, MS);
        p.slept(SOON, 2 * MS);
        p.passed(SPARSE_BELOW, Wait::None, false, 2 * MS);
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
        p.passed(1, Wait::None, false, MS);
        assert!(!p.is_sparse(MS));
        p.gathered();
        p.passed(SPARSE_BELOW - 1, Wait::Full, false, MS);
        assert!(p.is_sparse(MS));
        p.slept(SOON, 2 * MS);
        p.passed(GATHER_AFTER, Wait::None, false, 2 * MS);
        assert!(p.is_sparse(2 * MS), "one pass after a sleep is no burst");
    }

    /// Without sparseness, the rules of a busy link as before: a pass of
    /// GATHER_AFTER or a sleep shorter than BUSY_SLEEP gathers; a long
    /// sleep or a small pass does not.
    #[test]
    fn busy_links_gather() {
        let mut p = Pacing::default();
        p.passed(GATHER_AFTER, Wait::None, false, MS);
        assert!(p.take_gather());
        assert!(!p.take_gather(), "asked once");
        p.passed(GATHER_AFTER - 1, Wait::None, false, MS);
        assert!(!p.take_gather());
        p.slept(BUSY_SLEEP, MS);
        assert!(!p.take_gather());
        p.slept(SOON, MS);
        assert!(p.take_gather());
    }

    /// A lull starts a trial once gathering has been sampled for
    /// LULL_SAMPLE; a trial that wrote a quarter more per second than
    /// gathering did keeps the link sparse for LULL_FOR, and neither full
    /// passes nor bursts end that (a closed loop of many pairs makes both).
    #[test]
    fn a_lull_that_pays_lasts_its_time() {
        let mut p = Pacing::default();
        let t0 = nanos(LULL_SAMPLE);
        // Gathering: 32 requests every 2 ms (64 pairs in a closed loop).
        p.passed(32, Wait::Full, false, t0 / 2);
        assert!(!p.is_sparse(t0 / 2));
        p.passed(32, Wait::Lull, false, t0 / 2 + 2 * MS);
        p.passed(32, Wait::Lull, false, t0 / 2 + 4 * MS);
        assert!(!p.is_sparse(t0 / 2 + 4 * MS), "before LULL_SAMPLE");
        p.passed(32, Wait::Lull, false, t0);
        assert!(p.is_sparse(t0), "a trial");
        // Without the waits: 32 requests every 0.3 ms.
        let trial_end = t0 + nanos(LULL_TRIAL);
        let mut now = t0;
        while now < trial_end {
            now += 300_000;
            p.slept(SOON, now);
            assert!(!p.take_gather());
            p.passed(32, Wait::None, false, now);
            p.passed(GATHER_AFTER, Wait::None, false, now);
        }
        // Then gathering again, as slow as before: the check.
        assert!(!p.is_sparse(now), "checking");
        let check_end = now + nanos(LULL_SAMPLE);
        while now < check_end {
            now += 2 * MS;
            p.passed(32, Wait::Full, false, now);
        }
        assert!(p.is_sparse(now), "paid");
        p.slept(SOON, now + MS);
        assert!(!p.take_gather());
        let later = now + nanos(LULL_FOR);
        p.passed(SPARSE_BELOW, Wait::None, false, later);
        assert!(p.take_gather(), "over");
    }

    /// A load that grew during the trial (the rate after it as high as
    /// the trial's) does not make the trial pay.
    #[test]
    fn a_growing_load_is_no_lull() {
        let mut p = Pacing::default();
        let t0 = nanos(LULL_SAMPLE);
        p.passed(10 * t0 / MS, Wait::Lull, false, t0);
        p.passed(0, Wait::Lull, false, t0);
        assert!(p.is_sparse(t0), "a trial");
        let mut now = t0;
        while p.is_sparse(now) {
            now += MS;
            p.passed(100, Wait::None, false, now);
        }
        let check_end = now + nanos(LULL_SAMPLE);
        while now < check_end {
            now += MS;
            p.passed(100, Wait::Full, false, now);
        }
        assert!(!p.is_sparse(now), "barred");
        p.passed(100, Wait::Lull, false, now);
        p.passed(100, Wait::Lull, false, now);
        assert!(!p.is_sparse(now), "barred");
    }

    /// A trial that writes no more than gathering did (a paced load: its
    /// rate is its own) ends at once, and bars trials for LULL_BARRED.
    #[test]
    fn a_lull_that_does_not_pay_is_barred() {
        let mut p = Pacing::default();
        let t0 = nanos(LULL_SAMPLE);
        // 100 requests a millisecond, gathering or not.
        p.passed(100 * t0 / MS - 100, Wait::Lull, false, t0 - MS);
        p.passed(100, Wait::Lull, false, t0);
        assert!(p.is_sparse(t0));
        let mut now = t0;
        while p.is_sparse(now) {
            now += MS;
            p.passed(100, Wait::None, false, now);
            assert!(now <= t0 + nanos(LULL_TRIAL));
        }
        assert!(p.take_gather());
        p.passed(100, Wait::Lull, false, now + MS);
        p.passed(100, Wait::Lull, false, now + 2 * MS);
        assert!(!p.is_sparse(now + 2 * MS), "barred");
        // Still 100 a millisecond.
        let later = now + nanos(LULL_BARRED);
        p.passed(0, Wait::Full, false, later);
        let t1 = later + nanos(LULL_SAMPLE);
        p.passed(100 * nanos(LULL_SAMPLE) / MS, Wait::Lull, false, t1);
        assert!(!p.is_sparse(t1), "one lull alone");
        p.passed(0, Wait::None, false, t1);
        p.passed(100, Wait::Lull, false, t1 + MS);
        assert!(p.is_sparse(t1 + MS), "a trial again");
        // It does not pay either: barred twice as long.
        let mut now = t1 + MS;
        while p.is_sparse(now) {
            now += MS;
            p.passed(100, Wait::None, false, now);
        }
        let twice = now + 2 * nanos(LULL_BARRED);
        p.passed(100, Wait::Full, false, twice - MS);
        p.passed(100, Wait::Lull, false, twice - MS);
        p.passed(100, Wait::Lull, false, twice - MS);
        assert!(!p.is_sparse(twice - MS), "still barred");
        p.passed(100, Wait::Full, false, twice);
        let t2 = twice + nanos(LULL_SAMPLE);
        p.passed(100, Wait::Lull, false, t2);
        p.passed(100, Wait::Lull, false, t2);
        assert!(p.is_sparse(t2), "a trial after the double bar");
    }

    /// Idle time is no part of gathering's rate: after a long sleep the
    /// sample starts again (else a loop that starts on an idle link would
    /// find any trial paying).
    #[test]
    fn idle_time_is_not_sampled() {
        let mut p = Pacing::default();
        let t0 = 50 * nanos(LULL_SAMPLE);
        p.slept(LULL_SAMPLE, t0);
        p.passed(32, Wait::Lull, false, t0 + MS);
        p.passed(32, Wait::Lull, false, t0 + 2 * MS);
        assert!(!p.is_sparse(t0 + 2 * MS), "no sample yet");
        let t1 = t0 + nanos(LULL_SAMPLE);
        p.passed(32, Wait::Lull, false, t1);
        assert!(p.is_sparse(t1), "a trial");
    }

    /// A crowded pass (callers waiting for room in the budget) fails a
    /// trial under way, and clears the lulls counted so far; nor does its
    /// wait count for sparseness.
    #[test]
    fn a_crowded_link_has_no_lulls() {
        let mut p = Pacing::default();
        let t0 = nanos(LULL_SAMPLE);
        assert_eq!(p.passed(1, Wait::Full, true, t0), None);
        assert!(!p.is_sparse(t0), "a crowded wait is no futile one");
        p.passed(10, Wait::Lull, false, t0);
        assert_eq!(p.passed(10, Wait::Lull, true, t0), None);
        p.passed(10, Wait::Lull, false, t0);
        assert!(!p.is_sparse(t0), "the lulls before the crowd do not count");
        p.passed(10, Wait::Lull, false, t0);
        assert!(p.is_sparse(t0), "a trial");
        assert_eq!(p.passed(10, Wait::None, true, t0 + MS), Some(false));
        assert!(!p.is_sparse(t0 + MS), "barred");
    }

    /// Which full waits are lulls: the last push in the first quarter, or
    /// none during the wait at all.
    #[test]
    fn lulls_are_told_by_the_last_push() {
        let (start, end) = (10 * MS, 12 * MS);
        assert_eq!(Wait::full(start, end, start + MS / 4), Wait::Lull);
        assert_eq!(Wait::full(start, end, start - 1), Wait::Lull);
        assert_eq!(Wait::full(start, end, 0), Wait::Lull);
        assert_eq!(Wait::full(start, end, start + MS / 2), Wait::Full);
        assert_eq!(Wait::full(start, end, end - 1), Wait::Full);
    }
}
