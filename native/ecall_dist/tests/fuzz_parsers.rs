//! Property tests of every parser that reads bytes from the network:
//! incoming frames ([`Inbound`]), the frame length reader, atom cache
//! headers ([`InCache`]), and the epmd replies and handshake messages that
//! erl_dist parses for us.
//!
//! The properties: no input panics, no input makes a parser allocate or
//! produce more than its bound, and every case of the checked-in corpus
//! (`tests/corpus/inbound`, the crashes found from outside and their
//! relatives) gets the verdict its name states. Inputs are random bytes and
//! mutations of the corpus. The number of cases is proptest's default (256
//! per property) so that CI stays short; `PROPTEST_CASES=100000` runs a long
//! search.

mod common;

use common::corpus;
use ecall_dist::internals::inbound::{
    self, Inbound, Malformed, Verdict, MAX_DECODED, MAX_INCOMING_FRAME,
};
use ecall_dist::wire::conn_atom_cache::{Decoded, InCache};
use proptest::prelude::*;
use std::path::PathBuf;
use std::time::Duration;

fn expected_kind(name: &str) -> &'static str {
    ["answer", "ack", "ignore", "close"]
        .into_iter()
        .find(|k| name.starts_with(k))
        .unwrap_or_else(|| {
            panic!("{name}: the name must start with answer-, ack-, ignore- or close-")
        })
}

fn kind(v: &Verdict) -> &'static str {
    match v {
        Verdict::Answer(_) => "answer",
        Verdict::Ack { .. } => "ack",
        Verdict::Ignore => "ignore",
        Verdict::Close(_) => "close",
    }
}

#[test]
fn corpus_cases_get_their_verdicts() {
    for (name, body) in corpus() {
        let v = Inbound::default().handle(&body);
        assert_eq!(kind(&v), expected_kind(&name), "{name}: {v:?}");
        if let Verdict::Answer(frame) = v {
            let len = u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
            assert_eq!(len, frame.len() - 4, "{name}");
        }
    }
}

/// The two crashes reported from outside, at the size that killed the node
/// and far beyond it.
#[test]
fn nesting_costs_no_stack_at_any_depth() {
    for depth in [10_000usize, 1_000_000, 5_000_000] {
        let mut body = vec![112, 131, 104, 1];
        body.extend([108u8, 0, 0, 0, 1].repeat(depth));
        body.push(106);
        body.resize(body.len() + depth, 106);
        // Over the frame bound it would never reach the parser; the parser
        // itself has no depth limit to hit.
        assert_eq!(Inbound::default().handle(&body), Verdict::Ignore, "{depth}");
    }
}

fn check_verdict(v: &Verdict) {
    if let Verdict::Answer(frame) = v {
        assert!(frame.len() <= MAX_DECODED + 64);
        let len = u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
        assert_eq!(len, frame.len() - 4);
    }
}

/// A corpus case with some bytes changed, cut or added.
fn mutated() -> impl Strategy<Value = Vec<u8>> {
    let seeds = corpus();
    (
        0..seeds.len(),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0..3u8), 1..8),
    )
        .prop_map(move |(i, edits)| {
            let mut b = seeds[i].1.clone();
            for (at, byte, op) in edits {
                if b.is_empty() {
                    b.push(byte);
                    continue;
                }
                let at = at.index(b.len());
                match op {
                    0 => b[at] = byte,
                    1 => b.truncate(at),
                    _ => b.insert(at, byte),
                }
            }
            b
        })
}

proptest! {
    #[test]
    fn random_frames_never_panic(body in prop::collection::vec(any::<u8>(), 0..2048)) {
        check_verdict(&Inbound::default().handle(&body));
    }

    #[test]
    fn random_frames_behind_headers_never_panic(tail in prop::collection::vec(any::<u8>(), 0..2048),
                                               kind in prop::sample::select(vec![68u8, 69, 70])) {
        let mut body = vec![131, kind];
        body.extend(tail);
        check_verdict(&Inbound::default().handle(&body));
    }

    #[test]
    fn mutated_corpus_cases_never_panic(body in mutated()) {
        let mut inbound = Inbound::default();
        check_verdict(&inbound.handle(&body));
        // The same connection goes on: a cache updated by a bad frame does
        // not make a later good one panic either.
        let is_auth = std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/corpus/inbound/answer-is_auth.bin")).unwrap();
        prop_assert!(matches!(inbound.handle(&is_auth), Verdict::Answer(_)));
    }

    #[test]
    fn atom_cache_decoding_stays_within_its_bound(tail in prop::collection::vec(any::<u8>(), 0..4096),
                                                  limit in 0usize..8192) {
        let mut frame = vec![131, 68];
        frame.extend(tail);
        if let Some(Decoded::Body(b)) = InCache::default().decode(&frame, limit) {
            prop_assert!(b.len() <= limit);
        }
    }

    #[test]
    fn frame_lengths_never_size_a_buffer(len in any::<u32>(), rest in prop::collection::vec(any::<u8>(), 0..64)) {
        let mut input = len.to_be_bytes().to_vec();
        input.extend(&rest);
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let mut buf = Vec::new();
        let r = rt.block_on(inbound::read_frame(&mut &input[..], &mut buf));
        prop_assert!(buf.capacity() <= MAX_INCOMING_FRAME.max(64));
        if len as usize > MAX_INCOMING_FRAME {
            prop_assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::InvalidData);
        }
    }
}

/// The names of the refusals are a contract: Erlang sees them as
/// `{malformed, Name}` link-down reasons, and doc/behaviour.md lists them.
#[test]
fn malformed_reasons_keep_their_documented_names() {
    let names: Vec<&str> = [
        Malformed::TooLarge,
        Malformed::UnknownKind,
        Malformed::BadHeader,
        Malformed::BadTerm,
    ]
    .iter()
    .map(|m| m.as_str())
    .collect();
    assert_eq!(
        names,
        [
            "frame_too_large",
            "unknown_frame_kind",
            "bad_distribution_header",
            "bad_term"
        ]
    );
}

/// Serves `reply` to whoever connects, once per connection, then closes.
async fn fake_server(replies: Vec<Vec<u8>>) -> u16 {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        for reply in replies {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let _ = s.write_all(&reply).await;
            let _ = s.shutdown().await;
        }
    });
    port
}

/// erl_dist's epmd client reads what a peer host's epmd answers (the
/// `PORT2_RESP` of a look-up, the `ALIVE2` reply of a registration): random
/// answers and truncated real ones give an error, never a panic or a hang.
#[test]
fn epmd_replies_from_a_hostile_epmd() {
    use erl_dist::epmd::{EpmdClient, NodeEntry};
    use tokio_util::compat::TokioAsyncReadCompatExt;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut runner = proptest::test_runner::TestRunner::default();
    let good_port2: Vec<u8> = {
        // 119 0 <port> 72 0 <hi> <lo> <nlen> name <elen> extra
        let mut v = vec![119, 0, 0x10, 0x00, 72, 0, 0, 6, 0, 6, 0, 1, b'x', 0, 0];
        v.truncate(15);
        v
    };
    runner
        .run(
            &(
                prop::collection::vec(any::<u8>(), 0..64),
                0..good_port2.len(),
            ),
            |(random, cut)| {
                rt.block_on(async {
                    let port = fake_server(vec![
                        random.clone(),
                        good_port2[..cut].to_vec(),
                        random.clone(),
                    ])
                    .await;
                    for _ in 0..2 {
                        let s = tokio::net::TcpStream::connect(("127.0.0.1", port))
                            .await
                            .unwrap();
                        let r = tokio::time::timeout(
                            Duration::from_secs(5),
                            EpmdClient::new(s.compat()).get_node("x"),
                        )
                        .await;
                        assert!(r.is_ok(), "look-up hung");
                    }
                    let s = tokio::net::TcpStream::connect(("127.0.0.1", port))
                        .await
                        .unwrap();
                    let r = tokio::time::timeout(
                        Duration::from_secs(5),
                        EpmdClient::new(s.compat()).register(NodeEntry::new_hidden("x", 1)),
                    )
                    .await;
                    assert!(r.is_ok(), "registration hung");
                });
                Ok(())
            },
        )
        .unwrap();
}
