//! The links' clock: monotonic nanoseconds in a `u64`, which an atomic
//! can hold (when a link was last quiet: `LinkShared::quiet_since`).

use super::tuning::LONE_GAP_NS;

/// Monotonic nanoseconds since the first call (only differences matter).
/// Starts at [`LONE_GAP`](super::tuning::LONE_GAP) so that the first lone
/// write is never refused.
pub(super) fn clock() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let epoch = EPOCH.get_or_init(std::time::Instant::now);
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX) + LONE_GAP_NS
}
