//! What the stall deadline costs a write that completes: the link arms a
//! tokio timer around every socket write and drops it when the write
//! returns. This measures that arm-and-drop around a future that is ready
//! at once (the common case: the socket takes the bytes), against the
//! same future without a timer, in one run. It also measures a clock
//! read (`Instant::elapsed`), which a push that finds its link's writer
//! asleep pays to tell whether the link is quiet (`link::LONE_GAP`).
//!
//! `cargo run --release -p ecall_dist --example timer_cost`

use std::time::{Duration, Instant};

const N: u32 = 2_000_000;

async fn plain() -> Duration {
    let t0 = Instant::now();
    for i in 0..N {
        std::hint::black_box(std::future::ready(i).await);
    }
    t0.elapsed()
}

async fn with_deadline() -> Duration {
    let t0 = Instant::now();
    for i in 0..N {
        let due = tokio::time::Instant::now() + Duration::from_secs(30);
        let r = tokio::time::timeout_at(due, std::future::ready(i)).await;
        std::hint::black_box(r.ok());
    }
    t0.elapsed()
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        // Warm up, then alternate so that machine noise hits both.
        let _ = plain().await;
        let _ = with_deadline().await;
        let (mut p, mut d) = (Duration::ZERO, Duration::ZERO);
        for _ in 0..3 {
            p += plain().await;
            d += with_deadline().await;
        }
        let per = |t: Duration| t.as_nanos() as f64 / f64::from(3 * N);
        println!("ready future:                 {:6.1} ns", per(p));
        println!("ready future with a deadline: {:6.1} ns", per(d));
        println!("deadline cost per write:      {:6.1} ns", per(d) - per(p));
    });
    let t0 = Instant::now();
    let mut sum = 0u128;
    for _ in 0..N {
        sum = sum.wrapping_add(std::hint::black_box(t0).elapsed().as_nanos());
    }
    let per_read = t0.elapsed().as_nanos() as f64 / f64::from(N);
    std::hint::black_box(sum);
    println!("clock read (Instant::elapsed): {:6.1} ns", per_read);
}
