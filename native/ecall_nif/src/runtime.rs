//! The one tokio runtime that carries every link (`ecall-io` threads).
//!
//! NIF calls never block on it: they spawn on it (an identity's start, a
//! message a scheduler thread cannot send through an `OwnedEnv`) and
//! return.

use std::sync::OnceLock;

/// I/O threads: `ECALL_IO_THREADS`, else one per two cores the process
/// may use, at least 1 and at most 2. The threads share the cores with the
/// node's schedulers, and every wake-up of one may preempt a scheduler: on
/// a 2-core machine one thread gave the NIF transport more sends and calls
/// than two (doc/performance.md, "One link and one I/O thread per two
/// schedulers"). Machines of 4 cores and more get 2 (not measured).
fn io_threads() -> usize {
    std::env::var("ECALL_IO_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).clamp(1, 2))
        })
        .max(1)
}

/// The runtime, started on first use with [`io_threads`] threads.
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        let threads = io_threads();
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("ecall-io")
            .enable_all()
            .build()
            .expect("ecall: cannot start the I/O runtime")
    })
}
