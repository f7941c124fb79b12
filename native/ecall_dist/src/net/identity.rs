//! A C-node identity: one node name registered with the local epmd
//! ([`super::epmd`]), a listener for incoming connections
//! ([`super::accept`]), and the flags and creation that every connection
//! made under this name uses.
//!
//! Shutdown: dropping the [`Identity`] cancels its accept loop and every
//! incoming connection it serves, and closes the epmd connection, which
//! unregisters the name.

use crate::error::Error;
use crate::net::accept::{self, Listen};
use crate::net::epmd;
use crate::net::inbound::InboundStats;
use crate::net::log_every::LogEvery;
use crate::wire::dist_flags::flags;
use erl_dist::node::{Creation, LocalNode, NodeName};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
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
    pub tls: Option<crate::net::tls::TlsClient>,
    /// How long a name epmd refuses is asked for again before
    /// [`Identity::start`] gives up with [`Error::NameTaken`] (zero: asked
    /// once). See [`epmd::register`].
    pub register_retry: Duration,
}

/// A registered C-node name. See the module docs.
#[derive(Debug)]
pub struct Identity {
    local: LocalNode,
    pub(super) config: IdentityConfig,
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
        tokio::spawn(accept::accept_loop(
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
    pub(super) fn handshake_failed(&self, how: Failed, error: &str) {
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
pub(super) const LOG_EVERY: Duration = Duration::from_secs(10);

/// How an incoming handshake failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failed {
    Refused,
    TimedOut,
}
