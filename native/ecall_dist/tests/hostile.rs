//! Hostile peers against a real C-node identity: a real epmd, real TCP on
//! loopback, the real distribution handshake (erl_dist's client side, under
//! a made-up node name that has the cookie), then crafted frames.
//!
//! The rule under test: a malformed or oversized input closes the one
//! connection it came on (counted), and everything else goes on; a
//! well-formed but deep or long term is read and ignored without closing.

mod common;

use common::{corpus, counted, identity, identity_config, unique, Epmd, COOKIE, WAIT};
use ecall_dist::internals::inbound::{self, MAX_INCOMING_FRAME};
use ecall_dist::{Identity, IdentityConfig};
use erl_dist::handshake::{ClientSideHandshake, HandshakeStatus};
use erl_dist::node::{Creation, LocalNode};
use proptest::prelude::*;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::compat::TokioAsyncReadCompatExt;

/// Connects to `id` as `evil@localhost` and finishes the handshake.
async fn connect(id: &Identity, cookie: &str) -> TcpStream {
    let stream = TcpStream::connect(("127.0.0.1", id.port())).await.unwrap();
    let mut local = LocalNode::new(
        format!("{}@localhost", unique("evil")).parse().unwrap(),
        Creation::new(1),
    );
    local.flags = ecall_dist::wire::dist_flags::flags();
    let mut hs = ClientSideHandshake::new(stream.compat(), local, cookie);
    let status = hs
        .execute_send_name(erl_dist::LOWEST_DISTRIBUTION_PROTOCOL_VERSION)
        .await
        .expect("send_name");
    assert_eq!(status, HandshakeStatus::Ok);
    let (stream, _) = hs.execute_rest(true).await.expect("handshake");
    stream.into_inner()
}

async fn send_body(s: &mut TcpStream, body: &[u8]) {
    let mut f = (body.len() as u32).to_be_bytes().to_vec();
    f.extend_from_slice(body);
    s.write_all(&f).await.unwrap();
}

/// The next frame the C-node sends that is not a tick, or `None` if it
/// closed the connection.
async fn next_frame(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    loop {
        match tokio::time::timeout(WAIT, inbound::read_frame(s, &mut buf)).await {
            Err(_) => panic!("the C-node neither answered nor closed"),
            Ok(Ok(false)) => continue,
            Ok(Ok(true)) => return Some(buf),
            Ok(Err(_)) => return None,
        }
    }
}

fn is_auth() -> Vec<u8> {
    corpus()
        .into_iter()
        .find(|(n, _)| n == "answer-is_auth.bin")
        .unwrap()
        .1
}

/// Still serving: a fresh connection gets its ping answered.
async fn answers_ping(id: &Identity) {
    let mut s = connect(id, COOKIE).await;
    send_body(&mut s, &is_auth()).await;
    assert!(next_frame(&mut s).await.is_some(), "no answer to is_auth");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_corpus_case_over_a_real_connection() {
    let epmd = Epmd::start().await;
    let id: Arc<Identity> = identity(&epmd, COOKIE, Duration::from_secs(1)).await;
    let mut closes = 0;
    for (name, body) in corpus() {
        let mut s = connect(&id, COOKIE).await;
        send_body(&mut s, &body).await;
        if name.starts_with("close-") {
            closes += 1;
            assert_eq!(next_frame(&mut s).await, None, "{name}: connection kept");
        } else {
            if name.starts_with("ignore-") {
                // Nothing comes back for it; the connection still answers.
                send_body(&mut s, &is_auth()).await;
            }
            assert!(next_frame(&mut s).await.is_some(), "{name}: no answer");
        }
        assert_eq!(id.inbound.malformed.load(Relaxed), closes, "{name}");
    }
    answers_ping(&id).await;
}

/// A frame length over the bound closes the connection before anything is
/// buffered: 0xFFFFFFFF would have been a 4 GiB allocation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_frame_lengths_close_the_connection() {
    let epmd = Epmd::start().await;
    let id = identity(&epmd, COOKIE, Duration::from_secs(1)).await;
    for len in [u32::MAX, MAX_INCOMING_FRAME as u32 + 1] {
        let mut s = connect(&id, COOKIE).await;
        s.write_all(&len.to_be_bytes()).await.unwrap();
        s.write_all(&[112, 131, 106]).await.unwrap();
        assert_eq!(next_frame(&mut s).await, None, "{len}");
    }
    assert_eq!(id.inbound.malformed.load(Relaxed), 2);
    answers_ping(&id).await;
}

/// A nested term the size of the one that killed the node, then a ping on
/// the same connection: ignored, and the connection is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_terms_are_ignored_and_the_connection_stays() {
    let epmd = Epmd::start().await;
    let id = identity(&epmd, COOKIE, Duration::from_secs(1)).await;
    let mut s = connect(&id, COOKIE).await;
    // {net_kernel, C-node} ! [[[...]]] nested 200,000 levels (1 MB), the
    // largest that fits a frame.
    let mut body = is_auth();
    let ctl_end = body.iter().rposition(|&b| b == 131).unwrap();
    body.truncate(ctl_end);
    body.push(131);
    let depth = (MAX_INCOMING_FRAME - body.len() - 16) / 6;
    body.extend([108u8, 0, 0, 0, 1].repeat(depth));
    body.push(106);
    body.resize(body.len() + depth, 106);
    assert!(body.len() <= MAX_INCOMING_FRAME);
    send_body(&mut s, &body).await;
    send_body(&mut s, &is_auth()).await;
    assert!(next_frame(&mut s).await.is_some());
    assert_eq!(id.inbound.ignored.load(Relaxed), 1);
    assert_eq!(id.inbound.malformed.load(Relaxed), 0);
}

/// Random bytes where a handshake should be: refused and counted, the
/// listener goes on. Each connection ends its input so that the C-node
/// sees the end at once instead of waiting for its handshake deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_handshakes_are_refused() {
    let epmd = Epmd::start().await;
    let id = identity(&epmd, COOKIE, Duration::from_secs(1)).await;
    let handle = tokio::runtime::Handle::current();
    let cases = 64;
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(cases));
    let port = id.port();
    let n = std::sync::atomic::AtomicU32::new(0);
    tokio::task::block_in_place(|| {
        runner
            .run(&prop::collection::vec(any::<u8>(), 0..300), |bytes| {
                handle.block_on(async {
                    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
                    // A plausible start half the time: a send_name length.
                    if n.fetch_add(1, Relaxed) & 1 == 0 {
                        let _ = s.write_all(&(bytes.len() as u16).to_be_bytes()).await;
                    }
                    let _ = s.write_all(&bytes).await;
                    let _ = s.shutdown().await;
                    let mut sink = Vec::new();
                    let r = tokio::time::timeout(WAIT, s.read_to_end(&mut sink)).await;
                    assert!(r.is_ok(), "the C-node held a broken handshake open");
                });
                Ok(())
            })
            .unwrap();
    });
    let tried = u64::from(n.load(Relaxed));
    assert_eq!(counted(&id.refused, tried).await, tried, "refusals counted");
    assert_eq!(id.accepted.load(Relaxed), 0);
    answers_ping(&id).await;
}

/// A flood of connections that never start their handshake keeps no real
/// peer out: each newcomer past `MAX_PENDING_HANDSHAKES` closes the oldest
/// that has not sent its name (counted as shed, idle), not the handshake
/// deadline, so the identity holds at most that many sockets and a real
/// handshake made during the flood is answered.
///
/// The deadline is an hour here, so that no close of this test can be
/// the deadline's, however slowly the machine runs it: every close is
/// counted as shed (and none as timed out) by what the cap did, not by
/// how long the flood took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_connections_keeps_no_real_peer_out() {
    use ecall_dist::internals::pending::MAX_PENDING_HANDSHAKES;
    const FLOOD: usize = 4 * MAX_PENDING_HANDSHAKES;
    let epmd = Epmd::start().await;
    let id = Identity::start(IdentityConfig {
        handshake_timeout: Duration::from_secs(3600),
        ..identity_config(&epmd, COOKIE, Duration::from_secs(1))
    })
    .await
    .expect("identity starts");
    let mut idle = Vec::new();
    for _ in 0..FLOOD {
        idle.push(TcpStream::connect(("127.0.0.1", id.port())).await.unwrap());
    }
    answers_ping(&id).await;
    // Every connection past the cap, the ping's included, closed one.
    let shed = (FLOOD + 1 - MAX_PENDING_HANDSHAKES) as u64;
    assert_eq!(counted(&id.shed_idle, shed).await, shed, "shed idle");
    // The oldest ones, in the order they came, saw their close.
    for s in &mut idle[..FLOOD - MAX_PENDING_HANDSHAKES] {
        let mut sink = Vec::new();
        let closed = tokio::time::timeout(WAIT, s.read_to_end(&mut sink)).await;
        assert!(closed.is_ok(), "an evicted connection is still open");
    }
    assert_eq!(id.accepted.load(Relaxed), 1);
    assert_eq!(id.shed_stalled.load(Relaxed), 0);
    assert_eq!(id.timed_out.load(Relaxed), 0);
    drop(idle);
    // The ones still pending end their handshake (refused) at the close.
    let left = MAX_PENDING_HANDSHAKES as u64 - 1;
    assert_eq!(counted(&id.refused, left).await, left, "refused");
}

/// Closing an identity ends the handshakes under way: they do not keep it
/// (and its name in epmd) until their deadline, ten minutes here, far
/// past the [`WAIT`] this allows them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_an_identity_ends_its_pending_handshakes() {
    use ecall_dist::internals::pending::MAX_PENDING_HANDSHAKES;
    let epmd = Epmd::start().await;
    let id = Identity::start(IdentityConfig {
        handshake_timeout: Duration::from_secs(600),
        ..identity_config(&epmd, COOKIE, Duration::from_secs(1))
    })
    .await
    .expect("identity starts");
    // One past the cap: once the first is shed, each of the other 64 has
    // its handshake task.
    let mut idle = Vec::new();
    for _ in 0..=MAX_PENDING_HANDSHAKES {
        idle.push(TcpStream::connect(("127.0.0.1", id.port())).await.unwrap());
    }
    assert_eq!(counted(&id.shed_idle, 1).await, 1, "shed idle");
    let weak = Arc::downgrade(&id);
    id.close();
    drop(id);
    for s in &mut idle[1..] {
        let mut sink = Vec::new();
        let closed = tokio::time::timeout(WAIT, s.read_to_end(&mut sink)).await;
        assert!(closed.is_ok(), "a pending connection is still open");
    }
    // Nothing holds the identity any more.
    let gone = tokio::time::timeout(WAIT, async {
        while weak.strong_count() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(gone.is_ok(), "the identity is still held");
}

/// Connections that send their name and stop hold their slots only while
/// no newer connection needs one: a real handshake still gets in, closing
/// the oldest of them (counted as shed, stalled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_stalled_after_their_name_make_room_oldest_first() {
    use ecall_dist::internals::pending::MAX_PENDING_HANDSHAKES;
    let epmd = Epmd::start().await;
    let id = identity(&epmd, COOKIE, Duration::from_secs(1)).await;
    let mut stalled = Vec::new();
    for _ in 0..MAX_PENDING_HANDSHAKES {
        let stream = TcpStream::connect(("127.0.0.1", id.port())).await.unwrap();
        let mut local = LocalNode::new(
            format!("{}@localhost", unique("stall")).parse().unwrap(),
            Creation::new(1),
        );
        local.flags = ecall_dist::wire::dist_flags::flags();
        let mut hs = ClientSideHandshake::new(stream.compat(), local, COOKIE);
        // The status comes after the name was read: this one is named.
        let status = hs
            .execute_send_name(erl_dist::LOWEST_DISTRIBUTION_PROTOCOL_VERSION)
            .await
            .expect("send_name");
        assert_eq!(status, HandshakeStatus::Ok);
        stalled.push(hs);
    }
    answers_ping(&id).await;
    assert_eq!(counted(&id.shed_stalled, 1).await, 1, "shed stalled");
    assert_eq!(id.shed_idle.load(Relaxed), 0);
    assert_eq!(id.accepted.load(Relaxed), 1);
    // The oldest one was closed: the rest of its handshake fails at once.
    let oldest = stalled.remove(0);
    let rest = tokio::time::timeout(WAIT, oldest.execute_rest(true)).await;
    assert!(
        matches!(rest, Ok(Err(_))),
        "the oldest stalled connection is still open"
    );
}

/// A peer whose handshake lacks a flag the links need (here UTF-8 atoms)
/// is refused after its handshake, with the flag named in the reason: a
/// fake node (erl_dist's server side, registered with the real epmd)
/// offering everything else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_lacking_a_needed_flag_is_refused_by_name() {
    use ecall_dist::internals::connect;
    use ecall_dist::wire::dist_flags::{DIGEST_25, UTF8_ATOMS};
    use erl_dist::epmd::{EpmdClient, NodeEntry};
    use erl_dist::handshake::ServerSideHandshake;
    use erl_dist::DistributionFlags;

    let epmd = Epmd::start().await;
    let id = identity(&epmd, COOKIE, Duration::from_secs(15)).await;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let name = unique("old");
    let registration = TcpStream::connect(("127.0.0.1", epmd.port)).await.unwrap();
    let (_keep, creation) = EpmdClient::new(registration.compat())
        .register(NodeEntry::new_hidden(
            &name,
            listener.local_addr().unwrap().port(),
        ))
        .await
        .unwrap();
    let node = format!("{name}@{}", common::host());
    let mut local = LocalNode::new(node.parse().unwrap(), creation);
    local.flags = DistributionFlags::from_bits_truncate(DIGEST_25 & !UTF8_ATOMS);
    let server = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let mut hs = ServerSideHandshake::new(stream.compat(), local, COOKIE);
        hs.execute_recv_name().await.unwrap();
        let _ = hs.execute_rest(HandshakeStatus::Ok).await;
    });
    let connected = tokio::time::timeout(WAIT, connect(&id, &node, COOKIE))
        .await
        .expect("connect ends");
    let Err(err) = connected else {
        panic!("a peer without DFLAG_UTF8_ATOMS was accepted");
    };
    let text = err.to_string();
    assert!(text.contains("DFLAG_UTF8_ATOMS"), "{text}");
    assert!(matches!(err, ecall_dist::Error::Handshake(_)), "{err:?}");
    server.await.unwrap();
}
