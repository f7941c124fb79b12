//! The C-node against real `erl` nodes and a real epmd.
//!
//! Each test starts its own epmd on a free loopback port and its own `erl`
//! nodes, and stops them (by pid, on drop) whatever the outcome. Nodes report
//! back on stdout, one line per fact, so the tests wait on lines, not on
//! time.

mod common;

use common::{counted, epmd_names, host, identity, unique, Epmd, COOKIE, WAIT};
use ecall_dist::wire::etf::element_body;
use ecall_dist::{BatchCaps, Identity, LinkDown, LinkEvents, Peer, PeerConfig, Push};
use eetf::{Atom, FixInteger, Term, Tuple};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::sync::mpsc;

/// An `erl` node running `eval`, killed on drop.
///
/// Under `test/scripts/with_epmd.sh` (`ECALL_NODE_CRASHES` set) the node runs
/// under `test/scripts/node.sh`, as the Common Test suites' nodes do: a node that
/// dies of a crash signal (what a frame of ours that broke the peer's
/// emulator would do, even after the test's last line) fails the run.
/// The node runs in a process group of its own, so that what the test
/// kills and signals is the node and its wrapper together.
struct Erl {
    node: String,
    lines: Lines<BufReader<ChildStdout>>,
    _child: Child,
}

impl Drop for Erl {
    /// Kills the node's process group: `kill_on_drop` alone would kill
    /// the wrapper and leave the node running.
    fn drop(&mut self) {
        if let Some(pid) = self._child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Erl {
    fn start(epmd: &Epmd, cookie: &str, extra: &[&str], eval: &str) -> Erl {
        Erl::spawn(epmd, &unique("erl"), cookie, extra, eval)
    }

    fn start_named(epmd: &Epmd, name: &str, eval: &str) -> Erl {
        Erl::spawn(epmd, name, COOKIE, &[], eval)
    }

    fn spawn(epmd: &Epmd, name: &str, cookie: &str, extra: &[&str], eval: &str) -> Erl {
        let mut command = if std::env::var_os("ECALL_NODE_CRASHES").is_some() {
            let mut wrapped = Command::new(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../test/scripts/node.sh"
            ));
            wrapped.arg("erl");
            wrapped
        } else {
            Command::new("erl")
        };
        let mut child = command
            .process_group(0)
            .args(["-sname", name, "-setcookie", cookie, "-noinput", "-noshell"])
            .args(extra)
            .args(["-eval", eval])
            .env("ERL_EPMD_PORT", epmd.port.to_string())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("erl on PATH");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Erl {
            node: format!("{name}@{}", host()),
            lines,
            _child: child,
        }
    }

    /// The next line the node prints. An error report from the node fails
    /// the test with the report.
    async fn line(&mut self) -> String {
        let line = self.raw_line().await;
        if line.starts_with("=ERROR REPORT") || line.starts_with("=CRASH REPORT") {
            let mut report = vec![line];
            while let Ok(Ok(Some(l))) =
                tokio::time::timeout(Duration::from_secs(1), self.lines.next_line()).await
            {
                report.push(l);
            }
            panic!("{} reported:\n{}", self.node, report.join("\n"));
        }
        line
    }

    async fn raw_line(&mut self) -> String {
        tokio::time::timeout(WAIT, self.lines.next_line())
            .await
            .expect("erl said nothing in time")
            .unwrap()
            .expect("erl exited")
    }
}

#[derive(Debug)]
enum Event {
    Up,
    Down(LinkDown),
}

struct Events(mpsc::UnboundedSender<Event>);

impl LinkEvents for Events {
    fn up(&self, _link: usize) {
        let _ = self.0.send(Event::Up);
    }
    fn down(&self, _link: usize, reason: &LinkDown, _unconfirmed: u64) {
        let _ = self.0.send(Event::Down(reason.clone()));
    }
    fn alive(&self, _link: usize, _node: &str) {}
}

fn open_peer(
    id: &Arc<Identity>,
    node: &str,
    cookie: &str,
    receiver: &str,
) -> (Arc<Peer>, mpsc::UnboundedReceiver<Event>) {
    open_peer_stall(id, node, cookie, receiver, Duration::from_secs(10))
}

/// [`open_peer`] with its write deadline.
fn open_peer_stall(
    id: &Arc<Identity>,
    node: &str,
    cookie: &str,
    receiver: &str,
    stall: Duration,
) -> (Arc<Peer>, mpsc::UnboundedReceiver<Event>) {
    open_peer_with(id, node, cookie, receiver, stall, false)
}

/// [`open_peer_stall`], with the `flusher` setting.
fn open_peer_with(
    id: &Arc<Identity>,
    node: &str,
    cookie: &str,
    receiver: &str,
    stall: Duration,
    flusher: bool,
) -> (Arc<Peer>, mpsc::UnboundedReceiver<Event>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let peer = Peer::open(
        &tokio::runtime::Handle::current(),
        std::slice::from_ref(id),
        PeerConfig {
            node: node.into(),
            cookie: cookie.into(),
            receivers: vec![receiver.into()],
            shards: 1,
            caps: BatchCaps::default(),
            max_queue_bytes: 1 << 20,
            stall_timeout: Some(stall),
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_millis(500),
            gather: true,
            flusher,
        },
        Arc::new(Events(tx)),
    )
    .unwrap();
    (peer, rx)
}

/// A private epmd, an identity, a node running `eval` (which registers a
/// `sink` and prints "ready"), and a peer whose one link to that sink is
/// up, with its further link events. The epmd and the identity are
/// returned to be kept alive.
async fn sink_link(
    eval: &str,
) -> (
    Epmd,
    Arc<Identity>,
    Erl,
    Arc<Peer>,
    mpsc::UnboundedReceiver<Event>,
) {
    sink_link_stall(eval, Duration::from_secs(10)).await
}

/// [`sink_link`] with the link's write deadline.
async fn sink_link_stall(
    eval: &str,
    stall: Duration,
) -> (
    Epmd,
    Arc<Identity>,
    Erl,
    Arc<Peer>,
    mpsc::UnboundedReceiver<Event>,
) {
    let epmd = Epmd::start().await;
    let id = identity(&epmd, COOKIE, Duration::from_secs(15)).await;
    let mut erl = Erl::start(&epmd, COOKIE, &[], eval);
    assert_eq!(erl.line().await, "ready");
    let (peer, mut events) = open_peer_stall(&id, &erl.node, COOKIE, "sink", stall);
    assert!(matches!(next_event(&mut events).await, Event::Up));
    (epmd, id, erl, peer, events)
}

async fn next_event(rx: &mut mpsc::UnboundedReceiver<Event>) -> Event {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("no link event in time")
        .unwrap()
}

fn encode(t: &Term) -> Vec<u8> {
    let mut v = Vec::new();
    t.encode(&mut v).unwrap();
    v
}

fn atom(s: &str) -> Term {
    Term::from(Atom::from(s))
}

/// A node that prints `ready`, then every element of every `{batch, L}`
/// its process `sink` receives (`~w`, one line each), and halts after `n`
/// elements. How the elements were split into batches is the writer's
/// choice (it takes what is there when it wakes), so nothing here depends
/// on it.
fn sink_eval(n: usize) -> String {
    format!(
        "register(sink, self()), io:format(\"ready~n\"), \
         Loop = fun L(0) -> erlang:halt(); \
                    L(K) -> receive {{batch, B}} -> \
                                [io:format(\"~w~n\", [E]) || E <- B], L(K - length(B)) end end, \
         Loop({n})."
    )
}

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
    let header = BatchHeader::new("a_ecall_1@h", 3, "ecall_rx_1");
    let shard = Shard::new(&header, BatchCaps::default());
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
    assert!(ecall_dist::wire::conn_atom_cache::expand_ids(
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
    let expect = Term::from(Tuple::from(vec![
        atom("batch"),
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
    assert_eq!(erl.line().await, "{batch,[one,{two,2}]}");
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
    let err = ecall_dist::internals::cnode::connect(&id, &sink.node, "wrong")
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

/// A link that the peer drops reports it and reconnects; what was queued
/// meanwhile is delivered after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_loss_is_reported_and_reconnects() {
    let epmd = Epmd::start().await;
    let id = identity(&epmd, COOKIE, Duration::from_secs(15)).await;
    // Prints the first batch, drops our connection, prints the next one.
    let eval = "register(sink, self()), io:format(\"ready~n\"), \
                receive {batch, L1} -> io:format(\"~w~n\", [L1]) end, \
                [N] = nodes(hidden), true = erlang:disconnect_node(N), io:format(\"dropped~n\"), \
                receive {batch, L2} -> io:format(\"~w~n\", [L2]) end, erlang:halt().";
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
    assert_eq!(erl.line().await, "[second]");
    peer.close();
}

/// A peer node that restarts under the same name is a new incarnation:
/// the link stops instead of delivering to a node that has none of our
/// receivers yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_peer_stops_the_link() {
    let (epmd, _id, mut erl, peer, mut events) = sink_link(&sink_eval(1)).await;
    peer.push(0, element_body(&encode(&atom("first"))).unwrap(), 0);
    assert_eq!(erl.line().await, "first");
    let name = erl.node.split('@').next().unwrap().to_string();
    // The node halts after its batch; wait for the OS process to be gone.
    erl.exited().await;
    let eval = "register(sink, self()), io:format(\"ready~n\"), \
                receive M -> io:format(\"~w~n\", [M]) after 3000 -> io:format(\"nothing~n\") end, \
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
    assert_eq!(again.line().await, "nothing");
    peer.close();
}

impl Erl {
    /// Sends the node's process group (the node, and its wrapper when it
    /// has one) `sig` (`-STOP`, `-CONT`).
    fn signal(&self, sig: &str) {
        let group = format!("-{}", self._child.id().expect("erl runs"));
        let ok = std::process::Command::new("kill")
            .args([sig, "--", &group])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill {sig} -- {group}");
    }

    /// Waits until the node's OS process has exited.
    async fn exited(&mut self) {
        tokio::time::timeout(WAIT, self._child.wait())
            .await
            .expect("erl did not exit")
            .unwrap();
    }
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
    let first = ecall_dist::internals::cnode::connect(&id, &erl.node, COOKIE)
        .await
        .expect("first connection");
    assert_eq!(erl.line().await, "up");
    let t0 = std::time::Instant::now();
    let err = ecall_dist::internals::cnode::connect(&id, &erl.node, COOKIE)
        .await
        .unwrap_err();
    assert!(matches!(err, ecall_dist::Error::Alive), "{err}");
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "declining took {:?}",
        t0.elapsed()
    );
    drop(first);
    assert_eq!(erl.line().await, "down");
    ecall_dist::internals::cnode::connect(&id, &erl.node, COOKIE)
        .await
        .expect("reconnects");
}

/// A node whose process `sink` takes `{batch, L}` messages of `{I, _}`
/// elements and checks that the `I` run 1, 2, 3, ... without gap or
/// repeat; at the element `done` it prints `got N in order` (or the first
/// element out of order) and halts.
fn seq_eval() -> &'static str {
    "register(sink, self()), io:format(\"ready~n\"), \
     Loop = fun L(N, Bad) -> receive {batch, B} -> \
               case lists:foldl(fun(done, {M, Bd}) -> \
                                        io:format(\"got ~b ~s~n\", [M, case Bd of none -> \"in order\"; _ -> io_lib:format(\"out of order at ~w\", [Bd]) end]), \
                                        erlang:halt(); \
                                   ({I, _}, {M, none}) when I =:= M + 1 -> {I, none}; \
                                   (E, {M, none}) -> {M, E}; \
                                   (_, Acc) -> Acc end, {N, Bad}, B) of \
                   {N2, Bad2} -> L(N2, Bad2) end end end, \
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
    let epmd = Epmd::start().await;
    let id = identity(&epmd, COOKIE, Duration::from_secs(15)).await;
    let mut erl = Erl::start(&epmd, COOKIE, &[], seq_eval());
    assert_eq!(erl.line().await, "ready");
    let (peer, mut events) = open_peer_with(
        &id,
        &erl.node,
        COOKIE,
        "sink",
        Duration::from_secs(10),
        true,
    );
    assert!(matches!(next_event(&mut events).await, Event::Up));
    (epmd, id, erl, peer)
}

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

/// An urgent request (its caller waits for each answer before its next
/// one) behind a sleeping writer is written by its caller even on a link
/// written to a moment ago: the writer would write it alone anyway, one
/// thread wake-up later. 50 of them pushed back to back: without urgency,
/// only the first (the link is then busy for `LONE_GAP`) went alone; a
/// tick or anything else that wakes the writer meanwhile only sends a few
/// through it, hence "at least half".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urgent_requests_are_written_alone_on_a_busy_link() {
    use ecall_dist::internals::shard::Element;
    use std::sync::atomic::Ordering::Relaxed;
    let (_epmd, _id, mut erl, peer) = seq_link().await;
    writer_asleep(&peer).await;
    let ls = peer.link_stats(0).unwrap();
    let lone0 = ls.lone.load(Relaxed);
    for i in 1..=50 {
        let bytes = seq_element(i, 100);
        let urgent = Element {
            urgent: true,
            ..Element::text(&bytes)
        };
        assert_eq!(peer.push_element(0, urgent, 0), Push::Queued);
    }
    let lone = ls.lone.load(Relaxed) - lone0;
    let done = element_body(&encode(&atom("done"))).unwrap().to_vec();
    assert_eq!(peer.push(0, &done, 0), Push::Queued);
    assert_eq!(erl.line().await, "got 50 in order");
    assert!(lone >= 25, "{lone} of 50 urgent requests written alone");
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
/// the stopped node: ten more requests and `done` queue behind it; the
/// node, resumed, gets all `i + 10` in order.
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

/// A link reaped while the kernel still holds requests the peer has not
/// acknowledged (the peer is stopped, the buffers are full) counts them
/// as `unconfirmed`: the requests written alone before the one the socket
/// took only in part. That one's rest stalls the writer, and it is
/// counted as dropped instead (it never went out whole).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reaped_link_counts_what_the_kernel_still_held() {
    use std::sync::atomic::Ordering::Relaxed;
    let (_epmd, _id, erl, peer, mut events) =
        sink_link_stall(seq_eval(), Duration::from_millis(500)).await;
    erl.signal("-STOP");
    let ls = peer.link_stats(0).unwrap();
    fill_until_partial(&peer).await;
    let down = next_event(&mut events).await;
    erl.signal("-CONT");
    assert!(matches!(down, Event::Down(LinkDown::Stalled)), "{down:?}");
    let (lone, unconfirmed) = (ls.lone.load(Relaxed), ls.unconfirmed.load(Relaxed));
    eprintln!("{lone} lone writes, {unconfirmed} unconfirmed at the reap");
    assert_eq!(ls.dropped.load(Relaxed), 1);
    assert!(unconfirmed >= 1, "none of {lone} lone writes unconfirmed");
    assert!(
        unconfirmed < lone,
        "{unconfirmed} of {lone} lone writes unconfirmed"
    );
    peer.close();
}
