//! The wait between a link's reconnect attempts: `backoff_min` after a
//! connection that came up, doubling after each attempt that failed, up to
//! `backoff_max`.

use std::time::Duration;

/// See the module docs.
#[derive(Debug)]
pub(super) struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// The first wait is `min`.
    pub(super) fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max,
            next: min,
        }
    }

    /// A connection came up: the next wait is `min` again.
    pub(super) fn connected(&mut self) {
        self.next = self.min;
    }

    /// How long to wait before the next attempt; the wait after it is
    /// twice as long, at most `max`.
    pub(super) fn wait(&mut self) -> Duration {
        let now = self.next;
        self.next = now.checked_mul(2).unwrap_or(self.max).min(self.max);
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Failed attempts double the wait up to the cap; a connection that
    /// came up starts it again from the minimum.
    #[test]
    fn doubles_to_the_cap_and_starts_again_after_a_connection() {
        let mut b = Backoff::new(ms(100), ms(1000));
        let waits: Vec<_> = (0..6).map(|_| b.wait()).collect();
        assert_eq!(
            waits,
            [ms(100), ms(200), ms(400), ms(800), ms(1000), ms(1000)]
        );
        b.connected();
        assert_eq!(b.wait(), ms(100));
        assert_eq!(b.wait(), ms(200));
    }

    /// A cap below the minimum: the first wait is the minimum, the
    /// others the cap; a wait too long to double stays at the cap.
    #[test]
    fn odd_settings_stay_bounded() {
        let mut b = Backoff::new(ms(500), ms(100));
        assert_eq!([b.wait(), b.wait(), b.wait()], [ms(500), ms(100), ms(100)]);
        let mut b = Backoff::new(Duration::MAX, Duration::MAX);
        assert_eq!([b.wait(), b.wait()], [Duration::MAX, Duration::MAX]);
    }
}
