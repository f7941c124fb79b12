//! The write path against a real `erl` node: requests written alone by
//! their callers on a quiet link, flushes on the caller's side, what the
//! writer finishes when the socket takes only part, and what a reaped
//! link counts. Each test starts its own epmd and node, as in
//! `real_erl.rs`.

mod common;

use common::erl::*;
use common::{identity, Epmd, COOKIE, WAIT};
use ecall_dist::wire::etf::element_body;
use ecall_dist::{Identity, LinkDown, Peer, Push};
use eetf::{FixInteger, Term, Tuple};
use std::sync::Arc;
use std::time::Duration;

/// A node whose process `sink` takes `{batch, _, Stream, L}` messages of
/// `{I, _}` elements and checks that the `I` run 1, 2, 3, ... without gap
/// or repeat; at the element `done` it prints `got N in order` (or the
/// first element out of order) and halts. A batch whose number it has seen
/// in its shard (written again after a reconnect) it skips, as ecall's
/// receiver does.
fn seq_eval() -> &'static str {
    "register(sink, self()), io:format(\"ready~n\"), \
     Loop = fun L(N, Bad) -> receive {batch, _, <<_:64, Sh:32, S:64>>, B} -> \
       case get(Sh) of Last when is_integer(Last), S =< Last -> L(N, Bad); _ -> put(Sh, S), \
               case lists:foldl(fun(done, {M, Bd}) -> \
                                        io:format(\"got ~b ~s~n\", [M, case Bd of none -> \"in order\"; _ -> io_lib:format(\"out of order at ~w\", [Bd]) end]), \
                                        erlang:halt(); \
                                   ({I, _}, {M, none}) when I =:= M + 1 -> {I, none}; \
                                   (E, {M, none}) -> {M, E}; \
                                   (_, Acc) -> Acc end, {N, Bad}, B) of \
                   {N2, Bad2} -> L(N2, Bad2) end end end end, \
     Loop(0, none)."
}

fn seq_element(i: i32, pad: usize) -> Vec<u8> {
    let t = Term::from(Tuple::from(vec![
        Term::from(FixInteger::from(i)),
        Term::from(eetf::Binary::from(vec![7u8; pad])),
    ]));
    element_body(&encode(&t)).unwrap().to_vec()
}

/// Until a small push to link 0 would be written alone: its writer sleeps
/// (it does once it has nothing to write) and the link has been quiet for
/// `LONE_GAP`. A deadline, not a pause, bounds the wait.
async fn writer_asleep(peer: &Peer) {
    tokio::time::timeout(WAIT, async {
        while !peer.would_write_lone(0) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the link writer never went to sleep");
}

/// A [`seq_eval`] node, and a peer whose one link to its `sink` is up
/// (the epmd and the identity are returned to be kept alive).
async fn seq_link() -> (Epmd, Arc<Identity>, Erl, Arc<Peer>) {
    let (epmd, id, erl, peer, _events) = sink_link(seq_eval()).await;
    (epmd, id, erl, peer)
}

/// [`seq_link`] with flushes on the caller's side (`PeerConfig::flusher`).
async fn flush_link() -> (Epmd, Arc<Identity>, Erl, Arc<Peer>) {
    link_with(Duration::from_secs(15), true).await
}

/// A [`seq_eval`] node and a peer whose one link to its `sink` is up, its
/// identity ticking every `tick`, with flushes on the caller's side when
/// `flusher` (the epmd and the identity are returned to be kept alive).
async fn link_with(tick: Duration, flusher: bool) -> (Epmd, Arc<Identity>, Erl, Arc<Peer>) {
    let epmd = Epmd::start().await;
    let id = identity(&epmd, COOKIE, tick).await;
    let mut erl = Erl::start(&epmd, COOKIE, &[], seq_eval());
    assert_eq!(erl.line().await, "ready");
    let (peer, mut events) = open_peer_with(
        &id,
        &erl.node,
        COOKIE,
        "sink",
        Duration::from_secs(10),
        flusher,
    );
    assert!(matches!(next_event(&mut events).await, Event::Up));
    (epmd, id, erl, peer)
}

/// A tick once an hour: nothing but a test's pushes wakes the writer.
const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_requests_are_written_by_their_caller_in_order() {
    let (_epmd, _id, mut erl, peer) = seq_link().await;
    writer_asleep(&peer).await;
    // Small requests behind a sleeping writer: their callers write them,
    // and the writer stays asleep (whether each one is written alone
    // depends on nothing else waking the writer meanwhile, so only "some"
    // is asserted; the order and the count are exact).
    for i in 1..=200 {
        assert_eq!(peer.push(0, &seq_element(i, 100), 0), Push::Queued);
    }
    let done = element_body(&encode(&atom("done"))).unwrap().to_vec();
    assert_eq!(peer.push(0, &done, 0), Push::Queued);
    assert_eq!(erl.line().await, "got 200 in order");
    let ls = peer.link_stats(0).unwrap();
    let lone = ls.lone.load(std::sync::atomic::Ordering::Relaxed);
    assert!(lone > 0, "no lone write");
    // (`requests` is counted by the writer after its write returns, which
    // may be after the node printed its line: counted at push time here.)
    assert_eq!(
        peer.stats()
            .pushed
            .load(std::sync::atomic::Ordering::Relaxed),
        201
    );
    peer.close();
}

/// With `flusher` on, a push that finds the writer asleep (after the
/// first, written alone on the quiet link) answers `Flush(0)` instead of
/// waking it, and the pushes after it wake nobody until `Peer::flush`
/// writes them all from the caller's thread: 200 requests in 20 flushes
/// of 10, in order, with no writer wake-up. (A tick may still wake the
/// writer, which then writes what is queued itself: so the flushes that
/// wrote are asserted to be some, not 20.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushes_write_from_the_caller_in_order() {
    use std::sync::atomic::Ordering::Relaxed;
    let (epmd, _id, mut erl, peer) = flush_link().await;
    writer_asleep(&peer).await;
    let mut asked = 0;
    for round in 0..20 {
        let mut flush = None;
        for i in 1..=10 {
            match peer.push(0, &seq_element(round * 10 + i, 100), 0) {
                Push::Queued => {}
                Push::Flush(k) => {
                    assert!(flush.is_none(), "a flush asked for twice before it ran");
                    flush = Some(k);
                    asked += 1;
                }
                other => panic!("push answered {other:?}"),
            }
        }
        if let Some(k) = flush {
            assert_eq!(k, 0);
            while peer.flush(k) {}
        }
    }
    let done = element_body(&encode(&atom("done"))).unwrap().to_vec();
    if let Push::Flush(k) = peer.push(0, &done, 0) {
        while peer.flush(k) {}
    }
    assert_eq!(erl.line().await, "got 200 in order");
    let ls = peer.link_stats(0).unwrap();
    assert!(asked > 0, "no push asked for a flush");
    assert!(ls.flushes.load(Relaxed) > 0, "no flush wrote");
    assert_eq!(
        peer.stats().wakes.load(Relaxed),
        0,
        "a push woke the writer"
    );
    peer.close();
    drop(epmd);
}

/// A flush that finds a load of 64 KiB or more in its link's shards
/// (`GATHER_BYTES`: the writer's, which gathers and fragments) hands it to
/// the writer instead of writing it: counted in `flush_handoffs`, and the
/// writer writes everything, in order. The identity ticks once an hour, so
/// no tick wakes the writer to take the load before the flush looks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_hands_a_big_load_to_the_writer() {
    use std::sync::atomic::Ordering::Relaxed;
    let (epmd, _id, mut erl, peer) = link_with(HOUR, true).await;
    writer_asleep(&peer).await;
    // The first push on the quiet link goes alone; one soon after asks for
    // a flush.
    let (mut i, mut flush) = (0, None);
    while flush.is_none() {
        i += 1;
        assert!(i < 100, "no push asked for a flush");
        match peer.push(0, &seq_element(i, 100), 0) {
            Push::Queued => {}
            Push::Flush(k) => flush = Some(k),
            other => panic!("push answered {other:?}"),
        }
    }
    // Before the flush runs, 64 KiB more behind it.
    i += 1;
    assert_eq!(peer.push(0, &seq_element(i, 70_000), 0), Push::Queued);
    let ls = peer.link_stats(0).unwrap();
    let flushes = ls.flushes.load(Relaxed);
    let k = flush.unwrap();
    while peer.flush(k) {}
    assert_eq!(
        ls.flush_handoffs.load(Relaxed),
        1,
        "the flush kept the load"
    );
    assert_eq!(ls.flushes.load(Relaxed), flushes, "the flush wrote");
    let done = element_body(&encode(&atom("done"))).unwrap().to_vec();
    if let Push::Flush(k) = peer.push(0, &done, 0) {
        while peer.flush(k) {}
    }
    assert_eq!(erl.line().await, format!("got {i} in order"));
    peer.close();
    drop(epmd);
}

/// An urgent request (its caller waits for each answer before its next
/// one) behind a sleeping writer is written by its caller even on a link
/// written to a moment ago: the writer would write it alone anyway, one
/// thread wake-up later. 50 of them pushed back to back: every one is
/// written alone, and none wakes the writer. Without urgency only the
/// first went alone: the link is then busy for `LONE_GAP`, and the next
/// push woke the writer (counted in `wakes`). Nothing else wakes the
/// writer here: the identity ticks once an hour (a tick is the only write
/// of the writer's own on an idle link), so the counts are exact however
/// slowly the pushes run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urgent_requests_are_written_alone_on_a_busy_link() {
    use ecall_dist::internals::shard::Element;
    use std::sync::atomic::Ordering::Relaxed;
    let (_epmd, _id, mut erl, peer) = link_with(HOUR, false).await;
    writer_asleep(&peer).await;
    let ls = peer.link_stats(0).unwrap();
    let lone0 = ls.lone.load(Relaxed);
    let wakes0 = peer.stats().wakes.load(Relaxed);
    for i in 1..=50 {
        let bytes = seq_element(i, 100);
        let urgent = Element {
            urgent: true,
            ..Element::text(&bytes)
        };
        assert_eq!(peer.push_element(0, urgent, 0), Push::Queued);
    }
    let lone = ls.lone.load(Relaxed) - lone0;
    let wakes = peer.stats().wakes.load(Relaxed) - wakes0;
    // Not urgent, on a busy link: this one wakes the writer.
    let done = element_body(&encode(&atom("done"))).unwrap().to_vec();
    assert_eq!(peer.push(0, &done, 0), Push::Queued);
    assert_eq!(erl.line().await, "got 50 in order");
    assert_eq!(lone, 50, "{lone} of 50 urgent requests written alone");
    assert_eq!(wakes, 0, "an urgent push woke the writer");
    assert_eq!(ls.urgent.load(Relaxed), 50);
    peer.close();
}

/// Pushes sequence elements of 16,000 bytes to link 0 of a peer whose
/// node is stopped, each written alone while the writer sleeps, until the
/// socket buffers (a few MB on loopback) are full and the socket takes one
/// only in part; returns how many were pushed.
async fn fill_until_partial(peer: &Peer) -> i32 {
    let ls = peer.link_stats(0).unwrap();
    let mut i = 0;
    while ls.lone_partial.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        assert!(
            i < 4000,
            "64 MB written to a stopped peer without a partial write"
        );
        writer_asleep(peer).await;
        i += 1;
        assert_eq!(peer.push(0, &seq_element(i, 16_000), 0), Push::Queued);
    }
    i
}

/// With the writer awake and blocked on the rest of a partial write to
/// the stopped node (or its link reaped): ten more requests and `done`
/// queue behind it; the node, resumed, gets all `i + 10` in order, once.
async fn queue_behind_the_rest(erl: &mut Erl, peer: &Peer, mut i: i32) {
    for _ in 0..10 {
        i += 1;
        assert_eq!(peer.push(0, &seq_element(i, 1_000), 0), Push::Queued);
    }
    let done = element_body(&encode(&atom("done"))).unwrap().to_vec();
    assert_eq!(peer.push(0, &done, 0), Push::Queued);
    erl.signal("-CONT");
    assert_eq!(erl.line().await, format!("got {i} in order"));
}

/// A lone write the socket takes only in part (the peer is stopped and
/// the buffers are full) leaves the rest to the writer, before anything
/// queued after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_lone_write_is_finished_by_the_writer_first() {
    use std::sync::atomic::Ordering::Relaxed;
    let (_epmd, _id, mut erl, peer) = seq_link().await;
    erl.signal("-STOP");
    let ls = peer.link_stats(0).unwrap();
    let i = fill_until_partial(&peer).await;
    // The writer is awake now, finishing that write: these queue.
    queue_behind_the_rest(&mut erl, &peer, i).await;
    assert_eq!(ls.lone_partial.load(Relaxed), 1);
    assert_eq!(ls.dropped.load(Relaxed), 0);
    peer.close();
}

/// With flushes on, urgent requests pushed back to back on a link written
/// to a moment ago are not each written alone (`URGENT_GAP`): after the
/// first, on the quiet link, they ask for flushes, which write them
/// together. All 50 arrive, in order. (A push that came more than 50 µs
/// after the link's last write goes alone, so only "fewer than 50 alone"
/// and "some flush" are asserted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urgent_requests_share_flushes_on_a_busy_link() {
    use ecall_dist::internals::shard::Element;
    use std::sync::atomic::Ordering::Relaxed;
    let (epmd, _id, mut erl, peer) = flush_link().await;
    writer_asleep(&peer).await;
    let ls = peer.link_stats(0).unwrap();
    let lone0 = ls.lone.load(Relaxed);
    let mut asked = 0;
    for i in 1..=50 {
        let bytes = seq_element(i, 100);
        let urgent = Element {
            urgent: true,
            ..Element::text(&bytes)
        };
        match peer.push_element(0, urgent, 0) {
            Push::Queued => {}
            Push::Flush(k) => {
                asked += 1;
                while peer.flush(k) {}
            }
            other => panic!("push {i} answered {other:?}"),
        }
    }
    let lone = ls.lone.load(Relaxed) - lone0;
    let done = element_body(&encode(&atom("done"))).unwrap().to_vec();
    if let Push::Flush(k) = peer.push(0, &done, 0) {
        while peer.flush(k) {}
    }
    assert_eq!(erl.line().await, "got 50 in order");
    assert!(lone < 50, "every urgent request written alone");
    assert!(asked > 0 && ls.flushes.load(Relaxed) > 0, "no flush");
    peer.close();
    drop(epmd);
}

/// A flush the socket takes only in part (the peer is stopped and the
/// buffers are full) leaves the rest to the writer, which writes it before
/// anything queued after it, and counts its requests once: every request
/// arrives, in order, none counted dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_flush_is_finished_by_the_writer_first() {
    use std::sync::atomic::Ordering::Relaxed;
    let (epmd, _id, mut erl, peer) = flush_link().await;
    erl.signal("-STOP");
    writer_asleep(&peer).await;
    let ls = peer.link_stats(0).unwrap();
    let mut i = 0;
    // The first push on the quiet link goes alone; the next ones each ask
    // for a flush, made at once, until the socket takes one in part.
    while ls.lone_partial.load(Relaxed) == 0 {
        assert!(
            i < 4000,
            "64 MB written to a stopped peer without a partial write"
        );
        i += 1;
        match peer.push(0, &seq_element(i, 16_000), 0) {
            Push::Flush(k) => while peer.flush(k) {},
            Push::Queued => {}
            other => panic!("push {i} answered {other:?} before a partial write"),
        }
    }
    assert!(ls.flushes.load(Relaxed) > 0, "no flush wrote");
    // The writer, woken for the rest, is awake and blocked: these queue.
    queue_behind_the_rest(&mut erl, &peer, i).await;
    assert_eq!(ls.dropped.load(Relaxed), 0);
    peer.close();
    drop(epmd);
}

/// A link reaped while the peer is stopped (the buffers full, a lone
/// write taken only in part) loses nothing: what it wrote, and the rest,
/// is kept; once the peer runs again the link reconnects and writes it
/// again first, in order, and the peer (skipping the numbers it has seen)
/// gets every request once, in order, with what was pushed after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reaped_link_writes_again_what_was_not_acknowledged() {
    use std::sync::atomic::Ordering::Relaxed;
    let (_epmd, _id, mut erl, peer, mut events) =
        sink_link_stall(seq_eval(), Duration::from_millis(500)).await;
    erl.signal("-STOP");
    let ls = peer.link_stats(0).unwrap();
    let i = fill_until_partial(&peer).await;
    let down = next_event(&mut events).await;
    assert!(matches!(down, Event::Down(LinkDown::Stalled)), "{down:?}");
    queue_behind_the_rest(&mut erl, &peer, i).await;
    assert_eq!(ls.dropped.load(Relaxed), 0);
    assert!(ls.replayed.load(Relaxed) >= 1);
    peer.close();
}
