//! Real `erl` nodes for the integration tests, and C-node peers linked
//! to them.

use super::{host, identity, unique, Epmd, COOKIE, WAIT};
use ecall_dist::{BatchCaps, Identity, LinkDown, LinkEvents, Peer, PeerConfig};
use eetf::{Atom, Term};
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
pub struct Erl {
    pub node: String,
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
    pub fn start(epmd: &Epmd, cookie: &str, extra: &[&str], eval: &str) -> Erl {
        Erl::spawn(epmd, &unique("erl"), cookie, extra, eval)
    }

    pub fn start_named(epmd: &Epmd, name: &str, eval: &str) -> Erl {
        Erl::spawn(epmd, name, COOKIE, &[], eval)
    }

    pub fn spawn(epmd: &Epmd, name: &str, cookie: &str, extra: &[&str], eval: &str) -> Erl {
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
    pub async fn line(&mut self) -> String {
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

    pub async fn raw_line(&mut self) -> String {
        tokio::time::timeout(WAIT, self.lines.next_line())
            .await
            .expect("erl said nothing in time")
            .unwrap()
            .expect("erl exited")
    }
}

#[derive(Debug)]
pub enum Event {
    Up,
    Down(LinkDown),
}

pub struct Events(mpsc::UnboundedSender<Event>);

impl LinkEvents for Events {
    fn up(&self, _link: usize) {
        let _ = self.0.send(Event::Up);
    }
    fn down(&self, _link: usize, reason: &LinkDown) {
        let _ = self.0.send(Event::Down(reason.clone()));
    }
    fn alive(&self, _link: usize, _node: &str) {}
}

pub fn open_peer(
    id: &Arc<Identity>,
    node: &str,
    cookie: &str,
    receiver: &str,
) -> (Arc<Peer>, mpsc::UnboundedReceiver<Event>) {
    open_peer_stall(id, node, cookie, receiver, Duration::from_secs(10))
}

/// [`open_peer`] with its write deadline.
pub fn open_peer_stall(
    id: &Arc<Identity>,
    node: &str,
    cookie: &str,
    receiver: &str,
    stall: Duration,
) -> (Arc<Peer>, mpsc::UnboundedReceiver<Event>) {
    open_peer_with(id, node, cookie, receiver, stall, false)
}

/// [`open_peer_stall`], with the `flusher` setting.
pub fn open_peer_with(
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
            caps: BatchCaps {
                max_count: 1000,
                max_bytes: 1 << 20,
            },
            // Written batches stay in the budget until acknowledged, and
            // these nodes do not acknowledge: room for the tests that fill
            // a stopped node's socket buffers (a few MB on loopback).
            max_queue_bytes: 1 << 27,
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

/// What [`sink_link`] returns: the epmd and the identity (to be kept
/// alive), the node, the peer, and its link events.
pub type SinkLink = (
    Epmd,
    Arc<Identity>,
    Erl,
    Arc<Peer>,
    mpsc::UnboundedReceiver<Event>,
);

/// A private epmd, an identity, a node running `eval` (which registers a
/// `sink` and prints "ready"), and a peer whose one link to that sink is
/// up, with its further link events. The epmd and the identity are
/// returned to be kept alive.
pub async fn sink_link(eval: &str) -> SinkLink {
    sink_link_stall(eval, Duration::from_secs(10)).await
}

/// [`sink_link`] with the link's write deadline.
pub async fn sink_link_stall(eval: &str, stall: Duration) -> SinkLink {
    let epmd = Epmd::start().await;
    let id = identity(&epmd, COOKIE, Duration::from_secs(15)).await;
    let mut erl = Erl::start(&epmd, COOKIE, &[], eval);
    assert_eq!(erl.line().await, "ready");
    let (peer, mut events) = open_peer_stall(&id, &erl.node, COOKIE, "sink", stall);
    assert!(matches!(next_event(&mut events).await, Event::Up));
    (epmd, id, erl, peer, events)
}

pub async fn next_event(rx: &mut mpsc::UnboundedReceiver<Event>) -> Event {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("no link event in time")
        .unwrap()
}

pub fn encode(t: &Term) -> Vec<u8> {
    let mut v = Vec::new();
    t.encode(&mut v).unwrap();
    v
}

pub fn atom(s: &str) -> Term {
    Term::from(Atom::from(s))
}

/// A node that prints `ready`, then every element of every `{batch, _, _, L}`
/// its process `sink` receives (`~w`, one line each), and halts after `n`
/// elements. How the elements were split into batches is the writer's
/// choice (it takes what is there when it wakes), so nothing here depends
/// on it.
pub fn sink_eval(n: usize) -> String {
    format!(
        "register(sink, self()), io:format(\"ready~n\"), \
         Loop = fun L(0) -> erlang:halt(); \
                    L(K) -> receive {{batch, _, _, B}} -> \
                                [io:format(\"~w~n\", [E]) || E <- B], L(K - length(B)) end end, \
         Loop({n})."
    )
}

impl Erl {
    /// Sends the node's process group (the node, and its wrapper when it
    /// has one) `sig` (`-STOP`, `-CONT`).
    pub fn signal(&self, sig: &str) {
        let group = format!("-{}", self._child.id().expect("erl runs"));
        let ok = std::process::Command::new("kill")
            .args([sig, "--", &group])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill {sig} -- {group}");
    }

    /// Waits until the node's OS process has exited.
    pub async fn exited(&mut self) {
        tokio::time::timeout(WAIT, self._child.wait())
            .await
            .expect("erl did not exit")
            .unwrap();
    }
}
