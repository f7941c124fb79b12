//! Every tuning constant of the write path, in one place, each with the
//! workload that set its value. The mechanisms they tune are described in
//! `link/mod.rs` (gathering, sparse links, lulls), `link/side.rs` (lone
//! writes, flushes) and `link/pacing.rs` (when to gather); the writer's
//! states in `link/state.rs`. Two more live on the Erlang side, in
//! `ecall_request.erl`: what makes a caller's call urgent (`?CLOSED_LOOP_US`,
//! `?LOOP_COMPANY`). The numbers quoted are from `bench/run.sh` on a 2-core
//! machine.
//!
//! Each section opens with what its mechanism wins, from one sitting that
//! switched each mechanism off in turn (paced sweeps of send, cast and call
//! at 10,000 and 20,000 writers, the latency mode, closed loops of calls
//! and of sends at 1 to 1,000 callers; four baseline runs; `doc/performance.md`
//! has the table).

// --- Gathering: a busy link's writer waits for a batch worth a write ---
// Wins: on links that cannot flush (TLS, `flusher` false), paced calls
// 43-46 % and sends 17-23 % more per second at 10,000 and 20,000 writers
// (`bench/run.sh tls`); nothing beyond the spread on the default path,
// where flushes make the batches.

/// Requests in one shard that end a gathering wait.
pub const GATHER_REQUESTS: u32 = 128;

/// Bytes in one shard that end a gathering wait.
pub const GATHER_BYTES: usize = 64 * 1024;

/// The longest a gathering writer waits (tokio's timer has a resolution of
/// 1 ms, so in practice 1 to 2 ms): the most a request waits for company.
pub const GATHER_WAIT: std::time::Duration = std::time::Duration::from_millis(1);

/// A pass that wrote at least this many requests makes the next one gather:
/// below it the writer writes what comes at once (a lone request waits for
/// nothing).
pub const GATHER_AFTER: u64 = 4;

/// A writer woken this soon after it went to sleep takes its link for busy
/// and gathers before its next pass, unless the link is sparse (see
/// [`SPARSE_BELOW`]).
/// Without it a steady stream (a request
/// every few tens of µs) kept the writer in passes of one to three
/// requests, each followed by a sleep and a wake-up: on the paced call
/// load, 104,000 sleeps and batches of 15 per 2 M calls; with it, 7,000
/// sleeps and batches of 80-90. A link with a request every 200 µs or more
/// (5,000 per second) still gets each one written at once.
pub const BUSY_SLEEP: std::time::Duration = std::time::Duration::from_micros(200);

// --- Sparse links: no gathering where company does not come ---
// Wins: on links that cannot flush, one closed-loop sender 0.22-0.36 ms a
// round trip against 0.63-1.03 ms without it; never engages with flushes.

/// A gathering wait that ran its full length and brought fewer requests
/// than this makes the link sparse for [`SPARSE_FOR`]: it does not gather
/// then, and writes what it has at once. A closed loop looks like that:
/// senders that each wait for an answer before their next request (a
/// request and its reply exchanged by sends) bring no company, and a wait
/// for it is added to every round trip (one such sender took 1.8-1.9 ms a
/// round trip with gathering, 0.14-0.19 ms on a sparse link, against 0.07-0.14
/// ms for `!`: `ECALL_BENCH_EXCHANGE=send bench/run.sh pingpong`). The
/// sparseness ends early when a pass takes this many requests, or
/// [`GATHER_AFTER`] of them came while the pass before it wrote: a burst,
/// which closed-loop senders do not make. Fewer than 8 in 1-2 ms is fewer
/// than 4,000-8,000 requests a second on the link, where batches save
/// little; with 16, paced calls at 1,000 writers (about 9,000 a second per
/// link) went sparse and cost 10-30 % more CPU per call; with 8 (and the
/// writer's rule that a wait callers blocked on the budget could not fill
/// does not count) they cost what they did before.
pub const SPARSE_BELOW: u64 = 8;

/// How long a link stays sparse ([`SPARSE_BELOW`]) before a gathering wait
/// looks again: a load that grows back into batches gets them again by
/// then, and a closed loop pays one wait (1-2 ms) per period.
pub const SPARSE_FOR: std::time::Duration = std::time::Duration::from_millis(100);

// --- Lulls: trials of not gathering, for closed loops of many pairs ---
// Wins: on links that cannot flush, 64 pairs exchanging by sends 0.44-1.4
// ms a round trip against 2.5 ms without; never engages with flushes.

/// A gathering wait that ran its full length, whose company all came in its
/// first quarter and nothing after (the link's pushes came at once, then
/// stopped) is a *lull*; two in a row start a trial (see
/// `link/pacing.rs`): the link stops gathering for [`LULL_TRIAL`], and if
/// it wrote at least a quarter more requests per second than while it
/// gathered, before the trial and for [`LULL_SAMPLE`] after it, it stays
/// sparse for this long (doubled for each trial in a row that paid, up to
/// 16 times), whatever its passes bring. Closed loops of more
/// than a few pairs per link look like that: the answers to one batch come
/// back together, each releases one request, and then nothing comes until
/// the batch those requests make has gone out and been answered, so the
/// rest of the wait only delays them, and their rate rises without it.
/// Requests and replies exchanged by `ecall:send/2` by 64 pairs of
/// processes took 2.3 ms a round trip with gathering, 1-2 ms of it the wait
/// on each leg.
pub const LULL_FOR: std::time::Duration = std::time::Duration::from_millis(100);

/// Two lulls in a row (full waits, no full wait that was not a lull in
/// between) start a trial. One alone happens now and then on a machine
/// whose cores are all busy (the pushing threads did not run for the rest
/// of the wait), and each trial costs such a load its batches for
/// [`LULL_TRIAL`]: paced calls at 20,000 writers made 6-8 % fewer calls
/// with trials after every lull (about one per second per link).
pub const LULLS_IN_A_ROW: u32 = 2;

/// How long a lull's trial lasts ([`LULL_FOR`]). With 5 ms, 64 pairs
/// exchanging by sends fell back to 1.8-2.1 ms a round trip: a loop whose
/// peer still gathers makes two rounds in 5 ms, too few to show the gain.
pub const LULL_TRIAL: std::time::Duration = std::time::Duration::from_millis(10);

/// How long gathering must have run (since the link was last sparse after
/// a lull, or barred) for its rate to be compared in a trial, and how long
/// it gathers after a trial for the check against the rate after it.
pub const LULL_SAMPLE: std::time::Duration = std::time::Duration::from_millis(10);

/// After a trial that did not pay, lulls start no trial for this long
/// (doubled for each such trial in a row, up to 16 times).
/// A paced load's rate is its own: it writes no more without waits, and
/// only pays their cost in writes and wake-ups (its waits rarely look like
/// lulls: at 1,000 paced writers a push comes to each link every 100 µs or
/// so). Nor does a closed loop big enough to keep the machine busy, where
/// batches pay: 1,000 pairs exchanging by `ecall:send/2` made 267-302k
/// exchanges a second with batches of 127-137, and 154-207k with every lull
/// kept (batches of 7-8).
pub const LULL_BARRED: std::time::Duration = std::time::Duration::from_millis(250);

/// How precisely `LinkShared::gathering_push` is kept.
pub const PUSH_NOTE_GRAIN: std::time::Duration = std::time::Duration::from_micros(20);
pub(crate) const PUSH_NOTE_GRAIN_NS: u64 = PUSH_NOTE_GRAIN.as_nanos() as u64;

// --- Lone writes and flushes: a request on a quiet link written by its caller ---
// Wins (lone writes): an idle call's p99 89 % lower, 8 closed-loop callers
// 57 % faster per call. (Flushes, `link/side.rs`: 64 closed-loop callers
// 69 % faster per call, 64 pairs exchanging by sends 127 % faster.)

/// The largest request written alone; larger ones always queue (a single
/// `send` of more would likely be partial anyway).
pub const LONE_MAX: usize = 16 * 1024;

/// How long a link must have been quiet (its writer asleep, no lone write)
/// for a request to be written alone. A request on a link busier than that
/// wakes the writer, and what follows it queues behind the awake writer and
/// goes in batches: each request written alone costs a syscall on the
/// caller's scheduler and a message to decode on the peer, which a busy
/// link cannot afford, while a quiet one (a request now and then) gains a
/// thread hop per request. At most 2,000 lone writes per second per link,
/// and none on a link in steady use.
pub const LONE_GAP: std::time::Duration = std::time::Duration::from_micros(500);
pub(crate) const LONE_GAP_NS: u64 = LONE_GAP.as_nanos() as u64;

/// With flushes on (`Peer::flush`), how long a link must have been quiet
/// for an urgent request to be written alone: closer than that, urgent
/// requests come from several callers at once, and a flush writes them
/// together.
pub const URGENT_GAP: std::time::Duration = std::time::Duration::from_micros(50);
pub(crate) const URGENT_GAP_NS: u64 = URGENT_GAP.as_nanos() as u64;
