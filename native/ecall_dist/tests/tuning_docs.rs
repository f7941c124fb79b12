//! The tuning numbers the docs quote, against their definitions: the
//! constants of `link/tuning.rs` and the two of `ecall_rpc.erl`. A
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

/// The value of `-define(Name, Value).` in an Erlang source.
fn erl_define(path: &str, name: &str) -> u64 {
    let src = text(path);
    let start = format!("-define({name}, ");
    let at = src
        .find(&start)
        .unwrap_or_else(|| panic!("{path}: no {start}"));
    let rest = &src[at + start.len()..];
    rest[..rest.find(')').expect("a closing parenthesis")]
        .parse()
        .unwrap_or_else(|e| panic!("{path}: ?{name}: {e}"))
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
        &[format!("waiting up to {wait} for more to come")],
    );
}
