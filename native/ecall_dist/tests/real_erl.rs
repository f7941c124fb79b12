//! The C-node against real `erl` nodes and a real epmd: registration,
//! handshakes, ticks, reconnects, and what the peer reads. The write
//! path's own cases (lone writes, flushes, partial writes, reaps) are in
//! `write_path.rs`.
//!
//! Each test starts its own epmd on a free loopback port and its own `erl`
//! nodes, and stops them (by pid, on drop) whatever the outcome. Nodes report
//! back on stdout, one line per fact, so the tests wait on lines, not on
//! time.

mod common;

use common::erl::*;
use common::{counted, epmd_names, identity, Epmd, COOKIE, WAIT};
use ecall_dist::wire::etf::element_body;
use ecall_dist::{BatchCaps, Identity, LinkDown, Peer, Push};
use eetf::{FixInteger, Term, Tuple};
use std::time::Duration;

/// A name epmd already holds (here: another identity's) is refused as
/// `Error::NameTaken`, naming it, after the retry time given; once its
/// holder is gone, the same name registers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_name_is_name_taken_until_its_holder_goes() {
    let epmd = Epmd::start().await;
    let holder = identity(&epmd, COOKIE, Duration::from_secs(15)).await;
    let name = holder.node().to_string();
    let config = |retry| ecall_dist::IdentityConfig {
        node: name.clone(),
        cookie: COOKIE.into(),
        tick: Duration::from_secs(15),
        handshake_timeout: Duration::from_secs(10),
        epmd_port: epmd.port,
        listen: ecall_dist::Listen {
            addr: std::net::Ipv4Addr::LOCALHOST.into(),
            ports: (0, 0),
        },
        tls: None,
        register_retry: retry,
    };
    match Identity::start(config(Duration::ZERO)).await {
        Err(ecall_dist::Error::NameTaken(n)) => assert_eq!(n, name),
        other => panic!("expected NameTaken, got {other:?}"),
    }
    // epmd drops the name when the holder's registration connection
    // closes, a little after: the retry time covers that.
    drop(holder);
    let again = Identity::start(config(WAIT))
        .await
        .expect("the freed name registers");
    let names = epmd_names(epmd.port).await.unwrap();
    let short = again.node().split('@').next().unwrap();
    assert!(names.iter().any(|(n, _)| n == short), "{names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_with_epmd_and_delivers_spliced_batches() {
    let epmd = Epmd::start().await;
    let id = identity(&epmd, COOKIE, Duration::from_secs(15)).await;

    // Registered, as a hidden node, under the name given.
    let names = epmd_names(epmd.port).await.unwrap();
    let short = id.node().split('@').next().unwrap();
    assert!(
        names.iter().any(|(n, p)| n == short && *p == id.port()),
        "{names:?}"
    );

    let mut erl = Erl::start(&epmd, COOKIE, &[], &sink_eval(4));
    assert_eq!(erl.line().await, "ready");
    let (peer, mut events) = open_peer(&id, &erl.node, COOKIE, "sink");
    assert!(matches!(next_event(&mut events).await, Event::Up));

    // Elements encoded independently (as the NIF does), spliced into one
    // message without being decoded.
    let terms = [
        Term::from(Tuple::from(vec![
            atom("send"),
            Term::from(FixInteger::from(1)),
            atom("hello"),
        ])),
        Term::from(eetf::Binary::from(vec![1u8, 2, 3])),
        Term::from(eetf::List::from(vec![
            atom("a"),
            Term::from(FixInteger::from(-5)),
        ])),
    ];
    for t in &terms {
        assert_eq!(
            peer.push(0, element_body(&encode(t)).unwrap(), 0),
            Push::Queued
        );
    }
    assert_eq!(erl.line().await, "{send,1,hello}");
    assert_eq!(erl.line().await, "<<1,2,3>>");
    assert_eq!(erl.line().await, "[a,-5]");
    // OTP took the atom cache: atoms went as references.
    assert!(
        peer.stats()
            .cached_atoms
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );

    // A second batch, after the first: the link stays usable.
    let big = "x".repeat(70_000);
    peer.push(
        0,
        element_body(&encode(&Term::from(eetf::Binary::from(
            big.as_bytes().to_vec(),
        ))))
        .unwrap(),
        0,
    );
    let line = erl.line().await;
    assert!(
        line.starts_with("<<120,120,") && line.len() > 70_000,
        "{}",
        &line[..40]
    );
    peer.close();
}

/// Elements whose atoms the encoder made id references (`fixed_atom_ids`, as the
/// NIF does) reach a real node: the first time declared by the header, then
/// by slot only, in a lone write and in batches, in a message large enough
/// to go in fragments (its first fragment declares the ids), and beside an
/// atom as text in one element.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encode_time_atom_ids_reach_erl() {
    use ecall_dist::internals::shard::Element;
    use ecall_dist::wire::etf::{put_atom, ATOM_CACHE_REF, BINARY_EXT, SMALL_TUPLE_EXT};
    use ecall_dist::wire::fixed_atom_ids;
    let (_epmd, _id, mut erl, peer, _events) = sink_link(&sink_eval(5)).await;
    let r = |name: &str| {
        [
            ATOM_CACHE_REF,
            fixed_atom_ids::id_of(name.as_bytes()).unwrap(),
        ]
    };
    let pair = |a: &[u8], b: &[u8]| [&[SMALL_TUPLE_EXT, 2][..], a, b].concat();

    // Elements as the NIF hands them over: `text` and the ids they use.
    let el = |bytes: &[u8], text: bool, refs: u32| {
        let bytes = bytes.to_vec();
        move |peer: &Peer| {
            peer.push_element(
                0,
                Element {
                    bytes: &bytes,
                    text,
                    refs,
                    urgent: false,
                },
                0,
            )
        }
    };

    let small = pair(&r("hello_ids"), &r("world_ids"));
    assert_eq!(el(&small, false, 2)(&peer), Push::Queued);
    assert_eq!(erl.line().await, "{hello_ids,world_ids}");
    assert_eq!(el(&small, false, 2)(&peer), Push::Queued);
    assert_eq!(erl.line().await, "{hello_ids,world_ids}");

    let mut bin = vec![BINARY_EXT];
    bin.extend_from_slice(&70_000u32.to_be_bytes());
    bin.extend_from_slice(&[b'y'; 70_000]);
    let big = pair(&r("big_ids"), &bin);
    assert_eq!(el(&big, false, 1)(&peer), Push::Queued);
    let line = erl.line().await;
    assert!(line.starts_with("{big_ids,<<121,121,"), "{}", &line[..40]);
    let fragmented = peer
        .link_stats(0)
        .unwrap()
        .fragmented
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(fragmented, 1);

    let mut text = Vec::new();
    put_atom(&mut text, "text_atom");
    assert_eq!(
        el(&pair(&r("hello_ids"), &text), true, 1)(&peer),
        Push::Queued
    );
    assert_eq!(erl.line().await, "{hello_ids,text_atom}");
    // And one more with ids only, after the text one.
    assert_eq!(
        el(&pair(&r("world_ids"), &r("big_ids")), false, 2)(&peer),
        Push::Queued
    );
    assert_eq!(erl.line().await, "{world_ids,big_ids}");
    peer.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spliced_payload_is_what_binary_to_term_reads() {
    use ecall_dist::internals::shard::{Element, Shard};
    use ecall_dist::wire::etf::BatchHeader;
    let header = BatchHeader::new("a_ecall_1@h", 3, "ecall_rx_1", 5, 0);
    let shard = Shard::new(
        &header,
        BatchCaps {
            max_count: 1000,
            max_bytes: 1 << 20,
        },
    );
    let terms = [
        atom("one"),
        Term::from(Tuple::from(vec![
            atom("two"),
            Term::from(FixInteger::from(2)),
        ])),
    ];
    for t in &terms {
        shard.push(Element::text(element_body(&encode(t)).unwrap()), |_| ());
    }
    let frame = shard.take().unwrap();
    // The header's atoms are id references (fixed_atom_ids), declared by the
    // distribution header a link puts in front; written back as text, the
    // frame is plain external format.
    let mut bytes = Vec::new();
    assert!(ecall_dist::wire::term_walk::expand_ids(
        &frame.bytes,
        &mut bytes
    ));
    // Frame: length, pass-through, control, payload.
    let len = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
    assert_eq!(len, bytes.len() - 4);
    let mut cur = std::io::Cursor::new(&bytes[5..]);
    let control = Term::decode(&mut cur).unwrap();
    assert_eq!(
        control,
        Term::from(Tuple::from(vec![
            Term::from(FixInteger::from(6)),
            Term::from(eetf::Pid::new("a_ecall_1@h", 1, 0, 3)),
            atom(""),
            atom("ecall_rx_1"),
        ]))
    );
    let at = 5 + cur.position() as usize;
    let payload = &bytes[at..];
    let mut stream = 5u64.to_be_bytes().to_vec();
    stream.extend_from_slice(&0u32.to_be_bytes());
    stream.extend_from_slice(&1u64.to_be_bytes());
    let expect = Term::from(Tuple::from(vec![
        atom("batch"),
        atom("a_ecall_1@h"),
        Term::from(eetf::Binary::from(stream)),
        Term::from(eetf::List::from(terms.to_vec())),
    ]));
    assert_eq!(Term::decode(std::io::Cursor::new(payload)).unwrap(), expect);

    // And OTP's own decoder agrees.
    let epmd = Epmd::start().await;
    let hex: String = payload.iter().map(|b| format!("{b:02x}")).collect();
    let eval = format!(
        "Bin = binary:decode_hex(<<\"{hex}\">>), io:format(\"~w~n\", [binary_to_term(Bin)]), erlang:halt()."
    );
    let mut erl = Erl::start(&epmd, COOKIE, &[], &eval);
    assert_eq!(
        erl.line().await,
        "{batch,a_ecall_1@h,<<0,0,0,0,0,0,0,5,0,0,0,0,0,0,0,0,0,0,0,1>>,[one,{two,2}]}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_from_erl_and_cookie_checks() {
    let epmd = Epmd::start().await;
    let id = identity(&epmd, COOKIE, Duration::from_secs(15)).await;
    let node = id.node().to_string();
    let eval = format!("io:format(\"~p~n\", [net_adm:ping('{node}')]), io:format(\"~p~n\", [nodes(hidden)]), erlang:halt().");

    let mut good = Erl::start(&epmd, COOKIE, &[], &eval);
    assert_eq!(good.line().await, "pong");
    assert_eq!(good.line().await, format!("[{node}]"));

    let mut bad = Erl::start(&epmd, "another_cookie", &[], &eval);
    assert_eq!(bad.line().await, "pang");
    assert_eq!(counted(&id.refused, 1).await, 1);
    assert_eq!(counted(&id.accepted, 1).await, 1);

    // Outgoing, with the wrong cookie: the peer refuses the handshake.
    let mut sink = Erl::start(&epmd, COOKIE, &[], &sink_eval(1));
    assert_eq!(sink.line().await, "ready");
    let err = ecall_dist::internals::connect(&id, &sink.node, "wrong")
        .await
        .unwrap_err();
    assert!(matches!(err, ecall_dist::Error::Handshake(_)), "{err}");
}

/// With net_ticktime 2 s on the peer, a link idle for 5 s survives only
/// because the writer ticks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_link_survives_past_net_ticktime() {
    let epmd = Epmd::start().await;
    let id = identity(&epmd, COOKIE, Duration::from_millis(500)).await;
    let mut erl = Erl::start(
        &epmd,
        COOKIE,
        &["-kernel", "net_ticktime", "2"],
        &sink_eval(1),
    );
    assert_eq!(erl.line().await, "ready");
    let (peer, mut events) = open_peer(&id, &erl.node, COOKIE, "sink");
    assert!(matches!(next_event(&mut events).await, Event::Up));
    // This sleep is the subject of the test (an idle period), not a wait
    // for something to happen.
    let idle = tokio::time::sleep(Duration::from_secs(5));
    tokio::select! {
        _ = idle => {}
        e = events.recv() => panic!("link event while idle: {e:?}"),
    }
    peer.push(0, element_body(&encode(&atom("still_here"))).unwrap(), 0);
    assert_eq!(erl.line().await, "still_here");
    peer.close();
}

/// A link that the peer drops reports it and reconnects; the batch it had
/// written and the peer had not acknowledged goes again, first, under its
/// number, and what was queued meanwhile after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_loss_is_reported_and_reconnects() {
    let epmd = Epmd::start().await;
    let id = identity(&epmd, COOKIE, Duration::from_secs(15)).await;
    // Prints the first batch, drops our connection, prints the next one.
    let eval = "register(sink, self()), io:format(\"ready~n\"), \
                receive {batch, _, _, L1} -> io:format(\"~w~n\", [L1]) end, \
                [N] = nodes(hidden), true = erlang:disconnect_node(N), io:format(\"dropped~n\"), \
                receive {batch, _, <<_:96, 1:64>>, R} -> io:format(\"again ~w~n\", [R]) end, \
                receive {batch, _, <<_:96, 2:64>>, L2} -> io:format(\"~w~n\", [L2]) end, erlang:halt().";
    let mut erl = Erl::start(&epmd, COOKIE, &[], eval);
    assert_eq!(erl.line().await, "ready");
    let (peer, mut events) = open_peer(&id, &erl.node, COOKIE, "sink");
    assert!(matches!(next_event(&mut events).await, Event::Up));
    peer.push(0, element_body(&encode(&atom("first"))).unwrap(), 0);
    assert_eq!(erl.line().await, "[first]");
    assert_eq!(erl.line().await, "dropped");
    match next_event(&mut events).await {
        // The peer closed the socket; our next write may notice first.
        Event::Down(reason) => assert!(
            matches!(
                reason,
                LinkDown::PeerClosed | LinkDown::Read(_) | LinkDown::Write(_)
            ),
            "{reason}"
        ),
        e => panic!("expected down, got {e:?}"),
    }
    peer.push(0, element_body(&encode(&atom("second"))).unwrap(), 0);
    assert!(matches!(next_event(&mut events).await, Event::Up));
    assert_eq!(erl.line().await, "again [first]");
    assert_eq!(erl.line().await, "[second]");
    peer.close();
}

/// A peer node that restarts under the same name is a new incarnation:
/// the link stops instead of delivering to a node that has none of our
/// receivers yet. What reaches the new node first is a probe sent through
/// a new peer after the old link stopped: `second`, pushed to the old
/// link before, never went out. (The new node waits for whatever comes
/// first, without a deadline: it stays up however long the old link takes
/// to reach it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_peer_stops_the_link() {
    let (epmd, id, mut erl, peer, mut events) = sink_link(&sink_eval(1)).await;
    peer.push(0, element_body(&encode(&atom("first"))).unwrap(), 0);
    assert_eq!(erl.line().await, "first");
    let name = erl.node.split('@').next().unwrap().to_string();
    // The node halts after its batch; wait for the OS process to be gone.
    erl.exited().await;
    let eval = "register(sink, self()), io:format(\"ready~n\"), \
                receive {batch, _, <<_:96, S:64>>, L} -> io:format(\"~w ~w~n\", [S, L]) end, \
                erlang:halt().";
    let mut again = Erl::start_named(&epmd, &name, eval);
    assert_eq!(again.line().await, "ready");
    peer.push(0, element_body(&encode(&atom("second"))).unwrap(), 0);
    loop {
        match next_event(&mut events).await {
            Event::Down(LinkDown::Restarted) => break,
            Event::Down(_) => continue,
            Event::Up => panic!("link came up to a restarted peer"),
        }
    }
    peer.close();
    // A new peer is new to the new incarnation: it connects (once the
    // node has dropped whatever the old link's attempt left), and its
    // probe is the first message the node gets.
    let (probe, mut probe_events) = open_peer(&id, &again.node, COOKIE, "sink");
    loop {
        match next_event(&mut probe_events).await {
            Event::Up => break,
            Event::Down(_) => continue,
        }
    }
    probe.push(0, element_body(&encode(&atom("probe"))).unwrap(), 0);
    // Batch 1 of the new peer: nothing of the old one (`first`, written
    // and never acknowledged, and `second`) went to the new incarnation.
    assert_eq!(again.line().await, "1 [probe]");
    probe.close();
}

/// A peer that still holds a connection under our name answers `alive`:
/// the handshake is declined at once (erl_dist 0.8 would never finish a
/// continued one), and once the old connection is gone the next attempt
/// connects.
///
/// The second attempt waits for the peer's `nodeup`: our side of the
/// first handshake can finish before the peer's net_kernel has the
/// connection up, and an attempt in that window was accepted (once, in
/// CI-like load: `Connected` where `Alive` was expected).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alive_peer_is_declined_then_reconnects() {
    let epmd = Epmd::start().await;
    let id = identity(&epmd, COOKIE, Duration::from_secs(15)).await;
    let eval = "ok = net_kernel:monitor_nodes(true, [{node_type, all}]), io:format(\"ready~n\"), \
                receive {nodeup, _, _} -> io:format(\"up~n\") end, \
                receive {nodedown, _, _} -> io:format(\"down~n\") end, \
                receive never -> ok end.";
    let mut erl = Erl::start(&epmd, COOKIE, &[], eval);
    assert_eq!(erl.line().await, "ready");
    let first = ecall_dist::internals::connect(&id, &erl.node, COOKIE)
        .await
        .expect("first connection");
    assert_eq!(erl.line().await, "up");
    // "At once" is what the answer says, not a clock: `connect` has no
    // deadline of its own, so a continued handshake that never finished
    // would hang here until the guard (WAIT) fails it, and one that the
    // peer ended otherwise would not be `Alive`.
    let err = tokio::time::timeout(WAIT, ecall_dist::internals::connect(&id, &erl.node, COOKIE))
        .await
        .expect("the second handshake never ended")
        .unwrap_err();
    assert!(matches!(err, ecall_dist::Error::Alive), "{err}");
    drop(first);
    assert_eq!(erl.line().await, "down");
    ecall_dist::internals::connect(&id, &erl.node, COOKIE)
        .await
        .expect("reconnects");
}
