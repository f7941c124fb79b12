//! The numbers the docs quote, against their definitions: the constants
//! of `link/tuning.rs` (`LONE_MAX` standing for the NIF's inline encoding
//! bound, which equals it), the handshake cap of `net/pending.rs`, the
//! fragment size and the fixed atom ids of `wire/`, the incoming frame
//! bound (`net/inbound.rs`), the stall watchdog's piece
//! (`net/stall_write.rs`) and the NIF's `MANY_NORMAL` (read from their
//! source, which this crate's tests cannot import), and the defines of
//! `ecall_rpc.erl`, `ecall_conn_sup.erl` and `ecall_transport_nif.erl`
//! and the default `stall_timeout` of `ecall_config.erl` they quote. A
//! change to either side without the other fails here, as
//! `configuration_doc_matches_spec` does for the settings.

use ecall_dist::internals::tuning::*;
use std::path::Path;

/// A file of the repository, its whitespace runs made single spaces (so
/// that quotes may wrap).
fn text(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let raw = std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    raw.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What follows the first `start` in `path` (as `text` gives it).
fn after(path: &str, start: &str) -> String {
    let src = text(path);
    let at = src
        .find(start)
        .unwrap_or_else(|| panic!("{path}: no {start}"));
    src[at + start.len()..].to_string()
}

/// The value of `-define(Name, Value).` in an Erlang source.
fn erl_define(path: &str, name: &str) -> u64 {
    let rest = after(path, &format!("-define({name}, "));
    rest[..rest.find(')').expect("a closing parenthesis")]
        .parse()
        .unwrap_or_else(|e| panic!("{path}: ?{name}: {e}"))
}

/// The value of `const Name: usize = Value;` in a Rust source, `Value`
/// integer literals multiplied (`16 * 1024`), for a constant of a crate
/// these tests cannot import or of a private module.
fn rust_const(path: &str, name: &str) -> u64 {
    let rest = after(path, &format!("const {name}: usize = "));
    rest[..rest.find(';').expect("a semicolon")]
        .split('*')
        .map(|factor| {
            factor
                .trim()
                .replace('_', "")
                .parse::<u64>()
                .unwrap_or_else(|e| panic!("{path}: {name}: {factor:?}: {e}"))
        })
        .product()
}

/// `bytes` as the docs write it: "64 KiB".
fn kib(bytes: u64) -> String {
    assert_eq!(bytes % 1024, 0, "{bytes} is not a whole number of KiB");
    format!("{} KiB", bytes / 1024)
}

/// Fails with every quote of `want` that `path` lacks.
fn quotes(path: &str, want: &[String]) {
    let doc = text(path);
    let missing: Vec<&String> = want.iter().filter(|q| !doc.contains(q.as_str())).collect();
    assert!(missing.is_empty(), "{path} does not say {missing:?}");
}

/// "1-2 ms" for a wait of 1 ms: tokio's timer rounds up to its next tick.
fn gather_wait() -> String {
    let ms = GATHER_WAIT.as_millis();
    format!("{ms}-{} ms", ms + 1)
}

#[test]
fn behaviour_quotes_the_write_path_constants() {
    let request = "erlang_src/ecall_rpc.erl";
    let closed_loop_ms = erl_define(request, "CLOSED_LOOP_US") / 1000;
    let company = erl_define(request, "LOOP_COMPANY");
    quotes(
        "doc/behaviour.md",
        &[
            format!("the writer's last pass wrote {GATHER_AFTER} requests or more"),
            format!(
                "a request woke it less than {} µs after it fell asleep",
                BUSY_SLEEP.as_micros()
            ),
            format!(
                "until a shard holds {GATHER_REQUESTS} requests or {} KiB, or {} have passed",
                GATHER_BYTES / 1024,
                gather_wait()
            ),
            format!(
                "nothing written for {} µs), a request of {} KiB or less",
                LONE_GAP.as_micros(),
                LONE_MAX / 1024
            ),
            format!("a full batch or {} KiB in a shard", GATHER_BYTES / 1024),
            format!("its last call returned less than {closed_loop_ms} ms ago"),
            format!("When more than {company} closed-loop calls to the same peer"),
            format!("on a link quiet for {} µs", URGENT_GAP.as_micros()),
        ],
    );
}

#[test]
fn settings_and_api_docs_quote_the_gathering_wait() {
    let wait = gather_wait();
    quotes(
        "doc/configuration.md",
        &[format!(
            "a busy link waits up to {wait} for {GATHER_REQUESTS} requests"
        )],
    );
    quotes(
        "erlang_src/ecall.erl",
        &[format!("waits up to {wait} for a batch")],
    );
    quotes(
        "erlang_src/ecall_rpc.erl",
        &[
            format!("waiting up to {wait} for more to come"),
            format!("to {wait} waiting for company"),
        ],
    );
}

/// `n` as the docs write it: thousands set apart by commas (1,000).
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

/// The NIF's inline encoding bound, which the docs quote as where a large
/// message's path starts: `INLINE_MAX` in `ecall_nif`, which that crate
/// asserts equal to [`LONE_MAX`] at compile time.
fn inline_kib() -> String {
    format!("{} KiB", LONE_MAX / 1024)
}

#[test]
fn docs_quote_the_inline_encoding_bound() {
    let kib = inline_kib();
    quotes(
        "README.md",
        &[format!("A message whose encoding passes {kib} is encoded")],
    );
    quotes(
        "doc/behaviour.md",
        &[
            format!("a message within {kib}, on a dirty scheduler above"),
            format!("A request whose encoding passes {kib} (a long list"),
            format!("The NIF's inline encoder gives up at {kib}"),
        ],
    );
    quotes(
        "doc/performance.md",
        &[
            format!("Past {kib} the encoder"),
            format!("A request whose encoding passes {kib}, and a binary"),
            format!("with a message of more than {kib}, are encoded"),
        ],
    );
}

#[test]
fn operations_quotes_the_handshake_cap_and_the_closed_peers_kept() {
    use ecall_dist::internals::pending::MAX_PENDING_HANDSHAKES;
    let last_max = erl_define("erlang_src/ecall_conn_sup.erl", "LAST_MAX");
    quotes(
        "doc/operations.md",
        &[
            format!("while {MAX_PENDING_HANDSHAKES} handshakes were under way"),
            format!("for the last {} peers that closed", thousands(last_max)),
        ],
    );
}

#[test]
fn docs_quote_the_send_many_bound() {
    let many = thousands(rust_const("native/ecall_nif/src/push.rs", "MANY_NORMAL"));
    quotes(
        "doc/behaviour.md",
        &[format!(
            "on the caller's scheduler for up to {many} targets"
        )],
    );
    quotes(
        "doc/performance.md",
        &[
            format!("For {many} pids of one peer the whole push took"),
            format!("Lists of more than {many} targets, or with a message"),
        ],
    );
}

#[test]
fn docs_quote_the_large_and_direct_bounds() {
    let nif = "erlang_src/ecall_transport_nif.erl";
    let large = kib(erl_define(nif, "LARGE"));
    let direct = kib(erl_define(nif, "DIRECT"));
    quotes(
        "README.md",
        &[format!(
            "One of {direct} or more (a send, or a call's result)"
        )],
    );
    quotes(
        "CHANGELOG.md",
        &[format!(
            "a message of {direct} or more goes straight to its target"
        )],
    );
    quotes(
        "doc/architecture.md",
        &[format!(
            "A message whose encoding reaches {direct} skips the receiver"
        )],
    );
    quotes(
        "doc/behaviour.md",
        &[
            format!("and a binary message of {large} or more"),
            format!("encoding reaches {direct} goes back as that encoding"),
            format!("reaches {direct}, sent to a pid, a registered name"),
        ],
    );
    quotes(
        "doc/performance.md",
        &[
            format!("and a binary of {large} or more, is encoded"),
            format!("A message of {direct} or more goes straight"),
        ],
    );
}

#[test]
fn docs_quote_the_fragment_size_and_the_fixed_atom_ids() {
    use ecall_dist::wire::{fixed_atom_ids::IDS, fragment::FRAGMENT};
    let fragment = kib(FRAGMENT as u64);
    quotes(
        "doc/behaviour.md",
        &[format!(
            "any frame over {fragment} with a single message goes out in \
             distribution fragments, one {fragment} fragment per writer pass"
        )],
    );
    quotes(
        "doc/performance.md",
        &[
            format!("batches over {fragment} go in fragments"),
            format!("The first {IDS} atoms a node's encoder meets"),
        ],
    );
    quotes(
        "doc/architecture.md",
        &[format!("the first {IDS} atoms met, each with a fixed id")],
    );
}

#[test]
fn docs_quote_the_stall_watchdogs_piece() {
    let piece = rust_const("native/ecall_dist/src/net/stall_write.rs", "STALL_PIECE");
    let stall_ms = config_default("stall_timeout");
    assert_eq!(
        stall_ms % 1000,
        0,
        "the default stall_timeout is whole seconds"
    );
    let secs = stall_ms / 1000;
    // The floor on throughput, in KB/s with one decimal.
    let floor = format!("{:.1}", piece as f64 / secs as f64 / 1000.0);
    let piece = kib(piece);
    quotes(
        "README.md",
        &[format!("({secs} s per {piece}) is closed and reconnects")],
    );
    quotes(
        "doc/behaviour.md",
        &[
            format!("every {piece} of it must be taken by the socket"),
            format!("a floor on throughput ({piece} per `stall_timeout`"),
            format!("about {floor} KB/s at the default {secs} s"),
        ],
    );
    quotes(
        "doc/operations.md",
        &[
            format!("| `stall_timeout` | {stall_ms} ms |"),
            format!("longer than {secs} s per {piece} (raise it)"),
        ],
    );
}

/// The default of `Key` in `ecall_config:spec/0`: the integer after
/// `Key => {Type, `.
fn config_default(key: &str) -> u64 {
    let path = "erlang_src/ecall_config.erl";
    let rest = after(path, &format!("{key} => {{"));
    let rest = &rest[rest.find(", ").expect("a type, then the default") + 2..];
    rest[..rest.find(',').expect("a comma after the default")]
        .parse()
        .unwrap_or_else(|e| panic!("{path}: {key}'s default: {e}"))
}

#[test]
fn behaviour_quotes_the_incoming_frame_bound() {
    use ecall_dist::internals::inbound::MAX_INCOMING_FRAME;
    assert_eq!(MAX_INCOMING_FRAME % (1 << 20), 0, "not whole MiB");
    let mib = MAX_INCOMING_FRAME >> 20;
    quotes(
        "doc/behaviour.md",
        &[format!(
            "A frame over {mib} MiB is refused before it is buffered"
        )],
    );
}
