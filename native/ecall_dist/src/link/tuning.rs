//! Every tuning number of the write path, in one place, each with why it
//! has its value: what was measured, or "not measured" and the reason for
//! it. The mechanisms they tune are described in `link/mod.rs`
//! (gathering), `link/lent_side.rs` (lone writes, flushes) and
//! `link/pacing.rs` (when to gather); the measurements' figures are in
//! doc/performance.md, "Which write-path mechanisms earn their place".
//!
//! The two numbers of the Erlang side (what makes a call urgent) are
//! defined in `ecall_rpc.erl`, beside the code that reads them on
//! every call, each with why it has its value: `?CLOSED_LOOP_US` and
//! `?LOOP_COMPANY`. The settings' defaults are defined once, in
//! `ecall_config.erl`, and handed to the crate in `PeerConfig`.
//!
//! The docs quote several of these numbers; `tests/tuning_docs.rs` fails
//! when a quote and its constant differ.

// --- Gathering: a busy link's writer waits for a batch worth a write ---
// Wins: paced casts at 20,000 writers, in bigger batches that cost the
// peer less CPU per cast; sends and calls level (doc/performance.md,
// "Which write-path mechanisms earn their place").

/// Requests in one shard that end a gathering wait. Not measured on its
/// own: gathering's win above was measured with this value.
pub const GATHER_REQUESTS: u32 = 128;

/// Bytes in one shard that end a gathering wait: a fragment's worth
/// ([`FRAGMENT`](crate::wire::fragment::FRAGMENT)), which a pass writes
/// at once whatever the wait. Not measured.
pub const GATHER_BYTES: usize = 64 * 1024;

/// The longest a gathering writer waits (tokio's timer has a resolution of
/// 1 ms, so in practice 1 to 2 ms): the most a request waits for company.
/// The shortest wait the timer makes; not measured against longer ones.
pub const GATHER_WAIT: std::time::Duration = std::time::Duration::from_millis(1);

/// A pass that wrote at least this many requests makes the next one gather:
/// below it the writer writes what comes at once (a lone request waits for
/// nothing). Not measured on its own.
pub const GATHER_AFTER: u64 = 4;

/// A writer woken this soon after it went to sleep takes its link for busy
/// and gathers before its next pass. Without it a steady stream (a request
/// every few tens of µs) kept the writer in passes of one to three
/// requests, each followed by a sleep and a wake-up: measured on the paced
/// call load, it cut the writer's sleeps more than tenfold and made its
/// batches several times bigger. A link whose requests come further apart
/// than this still gets each one written at once.
pub const BUSY_SLEEP: std::time::Duration = std::time::Duration::from_micros(200);

// --- Lone writes and flushes: a request on a quiet link written by its caller ---
// Wins: a lone write saves an idle call, or a small closed loop's, the
// writer thread's wake-up, most of its round trip on two cores; a flush
// (`link/lent_side.rs`) saves it for closed loops of many callers on a link
// in use. Both measured by switching each off (doc/performance.md, "Which
// write-path mechanisms earn their place").

/// The largest request written alone; larger ones always queue (a single
/// `send` of more would likely be partial anyway). The NIF's inline
/// encoding limit (`INLINE_MAX` in `ecall_nif/src/encode/mod.rs`, which
/// asserts at compile time that the two are equal), so that any request
/// encoded on a normal scheduler may go alone. Not measured.
pub const LONE_MAX: usize = 16 * 1024;

/// How long a link must have been quiet (its writer asleep, no lone write)
/// for a request to be written alone. A request on a link busier than that
/// wakes the writer, and what follows it queues behind the awake writer and
/// goes in batches: each request written alone costs a syscall on the
/// caller's scheduler and a message to decode on the peer, which a busy
/// link cannot afford, while a quiet one (a request now and then) gains a
/// thread hop per request. At most 2,000 lone writes per second per link,
/// and none on a link in steady use. Not measured against other gaps: the
/// lone writes' win above was measured with this value.
pub const LONE_GAP: std::time::Duration = std::time::Duration::from_micros(500);
pub(crate) const LONE_GAP_NS: u64 = LONE_GAP.as_nanos() as u64;

/// With flushes on (`Peer::flush`), how long a link must have been quiet
/// for an urgent request to be written alone: closer than that, urgent
/// requests come from several callers at once, and a flush writes them
/// together. Not measured against other gaps: the flushes' win above was
/// measured with this value.
pub const URGENT_GAP: std::time::Duration = std::time::Duration::from_micros(50);
pub(crate) const URGENT_GAP_NS: u64 = URGENT_GAP.as_nanos() as u64;

// --- Closing ---

/// How long a closed link waits for the peer to close its side after ours
/// (see `LinkWriter::run`): a peer that has read everything closes within
/// a round trip; one that has not gets this long before the socket is
/// dropped. Not measured.
pub const LINGER: std::time::Duration = std::time::Duration::from_secs(2);
