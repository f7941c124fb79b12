//! A warning that a flood would repeat once per connection, let through
//! at most once per period. The lines it guards carry counts since start,
//! so what it holds back is still counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Lets a line through at most once per period, from any thread; the
/// first one always.
#[derive(Debug)]
pub struct LogEvery {
    base: Instant,
    every_ms: u64,
    /// Milliseconds after `base` from which the next line may go.
    next_ms: AtomicU64,
}

impl LogEvery {
    pub fn new(every: Duration) -> Self {
        LogEvery {
            base: Instant::now(),
            every_ms: every.as_millis() as u64,
            next_ms: AtomicU64::new(0),
        }
    }

    /// Whether a line may go now; if so, the next one waits a period.
    pub fn due(&self) -> bool {
        self.due_at(self.base.elapsed())
    }

    /// [`due`](Self::due) at `now` after the start. Of callers that ask
    /// at once, one gets `true`.
    fn due_at(&self, now: Duration) -> bool {
        let now = now.as_millis() as u64;
        let next = self.next_ms.load(Ordering::Relaxed);
        now >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now + self.every_ms,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn the_first_goes_then_one_per_period() {
        let gate = LogEvery::new(10 * S);
        assert!(gate.due_at(Duration::ZERO));
        assert!(!gate.due_at(Duration::ZERO));
        assert!(!gate.due_at(9 * S));
        assert!(gate.due_at(10 * S));
        assert!(!gate.due_at(19 * S));
        // A quiet spell does not bank lines.
        assert!(gate.due_at(100 * S));
        assert!(!gate.due_at(101 * S));
    }

    #[test]
    fn one_of_many_threads_at_once() {
        let gate = LogEvery::new(10 * S);
        let passed = std::thread::scope(|s| {
            let threads: Vec<_> = (0..8)
                .map(|_| s.spawn(|| (0..1000).filter(|_| gate.due_at(5 * S)).count()))
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().unwrap())
                .sum::<usize>()
        });
        assert_eq!(passed, 1);
    }
}
