//! What the link writer's atom cache rewrite costs per request: batches of
//! the benchmark's request (`{send, Pid, Map}`, the map of three maps of
//! ten atom keys, 63 atoms in all) through `OutCache::encode`, as the
//! writer does for every batch, in ns per request.
//!
//! `cargo run --release -p ecall_dist --example atom_cache_cost`
//!
//! Times drift on a shared machine; instruction counts do not:
//! `ATOM_CACHE_COST_REQUESTS=20000 valgrind --tool=callgrind
//! target/release/examples/atom_cache_cost` counts them (compare the
//! `Ir` of two builds).

use ecall_dist::wire::conn_atom_cache::OutCache;
use ecall_dist::wire::etf::{element_body, BatchHeader};
use eetf::{Atom, Map, Pid, Term, Tuple};
use std::time::Instant;

fn request() -> Vec<u8> {
    let inner = |_: usize| {
        Term::from(Map::from(
            (0..10)
                .map(|j| {
                    (
                        Term::from(Atom::from(format!("f{j}"))),
                        Term::from(Atom::from("v")),
                    )
                })
                .collect::<std::collections::HashMap<Term, Term>>(),
        ))
    };
    let map = Map::from(
        ["a", "b", "c"]
            .iter()
            .enumerate()
            .map(|(i, g)| (Term::from(Atom::from(*g)), inner(i)))
            .collect::<std::collections::HashMap<Term, Term>>(),
    );
    let t = Term::from(Tuple::from(vec![
        Term::from(Atom::from("send")),
        Term::from(Pid::new("ecall_test-2-12345@vm", 77, 0, 3)),
        Term::from(map),
    ]));
    let mut v = Vec::new();
    t.encode(&mut v).unwrap();
    v
}

fn main() {
    let req = request();
    let body = element_body(&req).unwrap();
    for per_batch in [1usize, 8, 40, 128] {
        let header = BatchHeader::new("a_ecall_1@vm", 1, "ecall_rx_1", 1, 0);
        let mut frame = header.as_bytes().to_vec();
        for _ in 0..per_batch {
            frame.extend_from_slice(body);
        }
        BatchHeader::seal(&mut frame, header.as_bytes().len(), per_batch as u32, 1);
        let mut cache = OutCache::default();
        let mut out = Vec::new();
        let requests: usize = std::env::var("ATOM_CACHE_COST_REQUESTS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(400_000);
        let batches = (requests / per_batch).max(1);
        // Warm the cache (the first message declares the atoms).
        cache.encode(&frame[5..], &mut out);
        let t0 = Instant::now();
        for _ in 0..batches {
            out.clear();
            cache.encode(std::hint::black_box(&frame[5..]), &mut out);
        }
        let ns = t0.elapsed().as_nanos() as f64 / (batches * per_batch) as f64;
        println!(
            "batch of {per_batch:>3}: {ns:>6.1} ns per request ({} bytes in, {} out per request)",
            frame.len() / per_batch,
            out.len() / per_batch
        );
    }
}
