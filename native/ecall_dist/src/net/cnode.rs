//! A C-node identity: one node name registered with the local epmd, a
//! listener for incoming connections, and the flags and creation that every
//! connection made under this name uses.
//!
//! Shutdown: dropping the [`Identity`] cancels its accept loop and every
//! incoming connection it serves, and closes the epmd connection, which
//! unregisters the name.

use crate::error::Error;
use crate::net::epmd;
use crate::net::handshake;
use crate::net::inbound::{self, InboundStats};
use crate::net::log_every::LogEvery;
use crate::net::pending::{Evicted, Pending, Slot, MAX_PENDING_HANDSHAKES};
use crate::wire::dist_flags::flags;
use erl_dist::node::{Creation, LocalNode, NodeName};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::compat::Compat;
use tokio_util::sync::CancellationToken;

/// Settings of one identity.
#[derive(Debug, Clone)]
pub struct IdentityConfig {
    /// Full node name, `a_ecall_1@host`.
    pub node: String,
    /// Cookie that incoming connections must prove.
    pub cookie: String,
    /// Write at least this often on every connection (peer net_ticktime/4).
    pub tick: Duration,
    /// Longest time a handshake may take.
    pub handshake_timeout: Duration,
    /// Port of epmd, here and on peers' hosts (one cluster, one port).
    pub epmd_port: u16,
    /// Where the listener for incoming connections binds.
    pub listen: Listen,
    /// TLS for the links (the node runs TLS distribution), or plain TCP.
    pub tls: Option<crate::net::stream::TlsClient>,
    /// How long a name epmd refuses is asked for again before
    /// [`Identity::start`] gives up with [`Error::NameTaken`] (zero: asked
    /// once). See [`epmd::register`].
    pub register_retry: Duration,
}

/// Where an identity listens: where the node's own distribution listens
/// (the Erlang side reads `inet_dist_use_interface`, the address family
/// of `-proto_dist` and `inet_dist_listen_min/max`), so that a node kept
/// to one interface or one port range does not get links listening
/// elsewhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listen {
    /// The address to bind (unspecified: every interface of its family).
    pub addr: std::net::IpAddr,
    /// The lowest and highest port to try, in order; `(0, 0)`: any port
    /// the system gives.
    pub ports: (u16, u16),
}

impl Default for Listen {
    /// Any IPv4 interface, any port (the node's own default).
    fn default() -> Self {
        Listen {
            addr: std::net::Ipv4Addr::UNSPECIFIED.into(),
            ports: (0, 0),
        }
    }
}

impl Listen {
    /// Binds the first free port of the range.
    async fn bind(&self) -> Result<TcpListener, Error> {
        let (lo, hi) = self.ports;
        if lo == 0 {
            return TcpListener::bind((self.addr, 0))
                .await
                .map_err(Error::io("listen"));
        }
        let mut last = std::io::Error::from(std::io::ErrorKind::AddrInUse);
        for port in lo..=hi {
            match TcpListener::bind((self.addr, port)).await {
                Ok(l) => return Ok(l),
                Err(e) => last = e,
            }
        }
        Err(Error::Io("listen (no free port in the range)", last))
    }
}

/// A registered C-node name. See the module docs.
#[derive(Debug)]
pub struct Identity {
    local: LocalNode,
    config: IdentityConfig,
    port: u16,
    cancel: CancellationToken,
    /// Incoming connections accepted (handshake done).
    pub accepted: AtomicU64,
    /// Incoming connections refused (bad cookie, bad handshake, closed by
    /// the peer before the handshake ended).
    pub refused: AtomicU64,
    /// Incoming handshakes that did not end within the handshake deadline.
    pub timed_out: AtomicU64,
    /// Incoming connections closed to make room for a newer one before
    /// they had sent their name ([`crate::net::pending`]).
    pub shed_idle: AtomicU64,
    /// Incoming connections closed to make room for a newer one after
    /// their name, before their handshake ended ([`crate::net::pending`]).
    pub shed_stalled: AtomicU64,
    /// Failed `accept` calls (each followed by a short wait).
    pub accept_errors: AtomicU64,
    /// What peers sent on accepted connections (`malformed` counts the
    /// connections closed for it).
    pub inbound: Arc<InboundStats>,
    /// The warning of a refused or timed-out incoming handshake.
    failed_log: LogEvery,
    _epmd: Compat<TcpStream>,
}

impl Identity {
    /// Binds a listener, registers the name with epmd (hidden node) and
    /// starts accepting. Must run inside a tokio runtime.
    pub async fn start(config: IdentityConfig) -> Result<Arc<Identity>, Error> {
        let name: NodeName = config
            .node
            .parse()
            .map_err(|e| Error::BadName(format!("{}: {e}", config.node)))?;
        let listener = config.listen.bind().await?;
        let port = listener.local_addr().map_err(Error::io("listen"))?.port();
        let (keep, creation) = epmd::register(
            &config.node,
            &name,
            port,
            config.epmd_port,
            config.register_retry,
        )
        .await?;
        let mut local = LocalNode::new(name, creation);
        local.flags = flags();
        let id = Arc::new(Identity {
            local,
            config,
            port,
            cancel: CancellationToken::new(),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            shed_idle: AtomicU64::new(0),
            shed_stalled: AtomicU64::new(0),
            accept_errors: AtomicU64::new(0),
            inbound: Arc::default(),
            failed_log: LogEvery::new(LOG_EVERY),
            _epmd: keep,
        });
        tokio::spawn(accept_loop(
            Arc::downgrade(&id),
            listener,
            id.cancel.clone(),
        ));
        Ok(id)
    }

    /// Our node as the handshake needs it.
    pub fn local_node(&self) -> LocalNode {
        self.local.clone()
    }

    /// Full node name.
    pub fn node(&self) -> &str {
        &self.config.node
    }

    /// Creation given by epmd.
    pub fn creation(&self) -> Creation {
        self.local.creation
    }

    /// Listening port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Tick interval.
    pub fn tick(&self) -> Duration {
        self.config.tick
    }

    /// Handshake deadline.
    pub fn handshake_timeout(&self) -> Duration {
        self.config.handshake_timeout
    }

    /// Stops accepting, ends the handshakes under way and closes the
    /// connections accepted. The name goes from epmd when the last
    /// reference to the identity is dropped, which the handshakes under way
    /// no longer hold up: their tasks end now, not at their deadline (an
    /// application restarted during a flood found its names still taken).
    pub fn close(&self) {
        self.cancel.cancel();
    }

    /// An incoming handshake that failed: counted, and a warning at most
    /// every [`LOG_EVERY`] (a flood of them would flood the log) with the counts
    /// since start, this one included; the others at debug. The line goes
    /// before the count: a count that shows the failure shows that its
    /// line was sent.
    fn handshake_failed(&self, how: Failed, error: &str) {
        let (count, what) = match how {
            Failed::Refused => (&self.refused, "incoming handshake refused"),
            Failed::TimedOut => (&self.timed_out, "incoming handshake timed out"),
        };
        if self.failed_log.due() {
            let refused = self.refused.load(Ordering::Relaxed) + u64::from(how == Failed::Refused);
            let timed_out =
                self.timed_out.load(Ordering::Relaxed) + u64::from(how == Failed::TimedOut);
            let every = LOG_EVERY.as_secs();
            tracing::warn!(
                node = self.node(),
                error,
                refused,
                timed_out,
                "{what} (at most one such line every {every} s; counts since start)"
            );
        } else {
            tracing::debug!(node = self.node(), error, "{what}");
        }
        count.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Identity {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// How often, at most, a warning that a flood of incoming connections
/// would repeat is logged: handshakes shed, refused or timed out (each
/// line has the counts since start).
const LOG_EVERY: Duration = Duration::from_secs(10);

async fn accept_loop(
    id: std::sync::Weak<Identity>,
    listener: TcpListener,
    cancel: CancellationToken,
) {
    let pending = Pending::new(MAX_PENDING_HANDSHAKES);
    let shed_log = LogEvery::new(LOG_EVERY);
    // After an accept error (EMFILE when the process is out of file
    // descriptors), wait before the next accept: retrying at once spins a
    // core and takes descriptors the rest of the node needs. Doubles up to
    // a second, back to the start after a success (as ranch's acceptor).
    const BACKOFF_MIN: Duration = Duration::from_millis(10);
    let mut backoff = BACKOFF_MIN;
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => return,
            a = listener.accept() => a,
        };
        let Some(me) = id.upgrade() else { return };
        let stream = match accepted {
            Ok((stream, _)) => {
                backoff = BACKOFF_MIN;
                stream
            }
            Err(e) => {
                me.accept_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(node = me.node(), error = %e, backoff_ms = backoff.as_millis() as u64,
                               "accept failed; waiting before the next");
                drop(me);
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let (slot, evicted) = pending.admit();
        if evicted.is_some() {
            // Counted by the connection that closes; logged at most every
            // few seconds (a flood would flood the log), with the counts
            // so far.
            if shed_log.due() {
                tracing::warn!(
                    node = me.node(),
                    max_pending = MAX_PENDING_HANDSHAKES,
                    shed_idle = me.shed_idle.load(Ordering::Relaxed),
                    shed_stalled = me.shed_stalled.load(Ordering::Relaxed),
                    "incoming handshakes at their cap: the connections doing the least are \
                     closed to make room (counted since start)"
                );
            }
        }
        tokio::spawn(serve_incoming(me, stream, slot, cancel.clone()));
    }
}

/// One incoming connection: its handshake, under the handshake deadline
/// and for as long as it keeps its slot, then, if accepted, what it sends.
async fn serve_incoming(
    me: Arc<Identity>,
    stream: TcpStream,
    slot: Slot,
    cancel: CancellationToken,
) {
    let _ = stream.set_nodelay(true);
    let hs = tokio::select! {
        hs = tokio::time::timeout(me.handshake_timeout(), async {
            let stream = match &me.config.tls {
                None => crate::net::stream::LinkStream::Tcp(stream),
                Some(tls) => tls.accept(stream).await?,
            };
            handshake::server(me.local_node(), &me.config.cookie, stream, &slot).await
        }) => hs,
        why = slot.closed() => {
            match why {
                Evicted::Idle => me.shed_idle.fetch_add(1, Ordering::Relaxed),
                Evicted::Stalled => me.shed_stalled.fetch_add(1, Ordering::Relaxed),
            };
            return;
        }
        // The identity is closing (Identity::close): this task must not
        // keep it.
        _ = cancel.cancelled() => return,
    };
    drop(slot);
    match hs {
        Ok(Ok((stream, peer))) => {
            me.accepted.fetch_add(1, Ordering::Relaxed);
            tracing::info!(node = me.node(), peer = %peer, "incoming connection");
            // The identity is not held while the connection lasts:
            // dropping it must cancel every connection it serves.
            let (tick, node) = (me.tick(), me.node().to_string());
            let stats = Arc::clone(&me.inbound);
            drop(me);
            let reason = serve_passive(stream, tick, &stats, cancel).await;
            if reason.starts_with("malformed") {
                tracing::warn!(node, peer = %peer, reason, "incoming connection closed");
            } else {
                tracing::info!(node, peer = %peer, reason, "incoming connection closed");
            }
        }
        Ok(Err(e)) => me.handshake_failed(Failed::Refused, &e),
        Err(_) => me.handshake_failed(Failed::TimedOut, "no handshake within the deadline"),
    }
}

/// How an incoming handshake failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failed {
    Refused,
    TimedOut,
}

/// Serves a connection on which we send nothing of our own: answers
/// `is_auth`, ticks, and returns why it ended.
async fn serve_passive(
    stream: crate::net::stream::LinkStream,
    tick: Duration,
    stats: &InboundStats,
    cancel: CancellationToken,
) -> String {
    let (mut rd, mut wr) = stream.into_split();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    let reader = async { inbound::read_loop(&mut rd, tx, stats).await.to_string() };
    let writer = async move {
        let mut ticker = tokio::time::interval(tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let r = tokio::select! {
                _ = ticker.tick() => wr.write_all(&inbound::TICK).await,
                m = rx.recv() => match m {
                    Some(frame) => wr.write_all(&frame).await,
                    None => return "reader gone".to_string(),
                },
            };
            // TLS holds what it was given until flushed.
            let r = match r {
                Ok(()) => wr.flush().await,
                e => e,
            };
            if let Err(e) = r {
                return format!("write: {e}");
            }
        }
    };
    tokio::select! {
        r = reader => r,
        r = writer => r,
        _ = cancel.cancelled() => "identity stopped".to_string(),
    }
}

/// A connection made by [`connect`].
#[derive(Debug)]
pub struct Connected {
    /// The socket (TLS when the identity has it), handshake done.
    pub stream: crate::net::stream::LinkStream,
    /// The peer's creation (its incarnation; 0 if it did not say).
    pub creation: u32,
    /// Whether both sides use the atom cache on this connection.
    pub atom_cache: bool,
    /// Whether both sides take fragmented messages.
    pub fragments: bool,
}

/// Client side of the handshake with `peer` (`name@host`), under `me`.
///
/// Errors: [`Error::Epmd`] for anything about the peer's epmd (its socket
/// included), [`Error::NotRegistered`], [`Error::Io`] only for the TCP
/// connection to the peer itself, [`Error::Handshake`] and [`Error::Alive`].
pub async fn connect(me: &Identity, peer: &str, cookie: &str) -> Result<Connected, Error> {
    let name: NodeName = peer
        .parse()
        .map_err(|e| Error::BadName(format!("{peer}: {e}")))?;
    let port = epmd::lookup(&name, peer, me.config.epmd_port).await?;
    let stream = TcpStream::connect((name.host(), port))
        .await
        .map_err(Error::io("connect to the peer"))?;
    let _ = stream.set_nodelay(true);
    let stream = match &me.config.tls {
        None => crate::net::stream::LinkStream::Tcp(stream),
        Some(tls) => tls.connect(name.host(), stream).await?,
    };
    handshake::client(me.local_node(), cookie, stream).await
}
