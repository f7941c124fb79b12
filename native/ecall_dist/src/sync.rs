//! The synchronisation types of the protocols that loom checks (the
//! sleeping-writer protocol, `link/protocol.rs` over `link/state.rs`, and
//! the byte budget, `queue/budget.rs`):
//! std's, or loom's (a dev-dependency) in the crate's tests built with the
//! `loom` feature, whose model tests (`cargo test --release -p ecall_dist
//! --features loom --lib loom`) run every interleaving of those protocols;
//! the feature does nothing outside tests. Nothing else in the crate uses
//! these types.

#[cfg(not(all(test, feature = "loom")))]
pub(crate) use std::sync::atomic::{AtomicU8, AtomicUsize};
#[cfg(not(all(test, feature = "loom")))]
pub(crate) use std::sync::{Mutex, MutexGuard};

#[cfg(all(test, feature = "loom"))]
pub(crate) use loom::sync::atomic::{AtomicU8, AtomicUsize};
#[cfg(all(test, feature = "loom"))]
pub(crate) use loom::sync::{Mutex, MutexGuard};

/// Runs a loom model: every interleaving with at most three preemptions
/// (loom's advice: bugs of this kind need few, and unbounded runs of the
/// models' loops take minutes).
#[cfg(all(test, feature = "loom"))]
pub(crate) fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}
