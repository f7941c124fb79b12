//! The listener of an identity and what it accepts: the port it binds
//! ([`Listen`]), the accept loop, and each incoming connection: its
//! handshake under a deadline and a slot among the handshakes under way
//! ([`crate::net::pending`]), then what the peer sends, answered
//! (`is_auth`) and ticked.

use crate::error::Error;
use crate::net::handshake;
use crate::net::identity::{Failed, Identity, LOG_EVERY};
use crate::net::inbound::{self, InboundStats};
use crate::net::log_every::LogEvery;
use crate::net::pending::{Evicted, Pending, Slot, MAX_PENDING_HANDSHAKES};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

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
    pub(super) async fn bind(&self) -> Result<TcpListener, Error> {
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

/// Accepts on `listener` until `cancel` (or the identity goes), each
/// connection's handshake in a task of its own, at most
/// [`MAX_PENDING_HANDSHAKES`] under way.
pub(super) async fn accept_loop(
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
    // No link writes on an accepted connection: nothing to acknowledge.
    let reader = async {
        inbound::read_loop(&mut rd, tx, stats, &|_, _, _| true)
            .await
            .to_string()
    };
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
