//! C-node identities: `cnode_start/4` and `cnode_info/1`.

use crate::events::map_of;
use crate::runtime::runtime;
use crate::{atoms, encode, CNode};
use ecall_dist::{Identity, IdentityConfig, Listen};
use rustler::env::OwnedEnv;
use rustler::{Atom, Encoder, Env, NifResult, ResourceArc, Term};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// Options of `cnode_start/4`, all required (the Erlang side fills them).
#[derive(rustler::NifMap)]
struct CNodeOpts {
    tick_ms: u64,
    handshake_ms: u64,
    epmd_port: u16,
    /// Address to listen on, as text (`"0.0.0.0"`, `"::"`, `"127.0.0.1"`).
    listen_addr: String,
    /// Port range to listen on; `0, 0`: any.
    listen_min: u16,
    listen_max: u16,
    /// TLS on the links (the node runs TLS distribution), with the node's
    /// client options (`ssl_dist_optfile`); the files are read on a
    /// runtime thread, not here.
    tls: bool,
    tls_certfile: String,
    tls_keyfile: String,
    tls_cacertfile: String,
    tls_sni: bool,
    /// The node's server files for the identities' listener (empty: the
    /// client's).
    tls_server_certfile: String,
    tls_server_keyfile: String,
    tls_server_cacertfile: String,
    /// How long a name epmd refuses is asked for again (ms) before the
    /// answer is `{name_taken, Node}`.
    register_retry_ms: u64,
}

/// Starts identities `nodes` (full names) registered with the epmd on
/// `epmd_port`, listening where `opts` says; answers the caller with
/// `{ecall_cnode, Ref, {ok, CNode} | {error, Reason}}`.
#[rustler::nif]
fn cnode_start(
    env: Env<'_>,
    nodes: Vec<String>,
    cookie: String,
    opts: CNodeOpts,
    reference: Term<'_>,
) -> NifResult<Atom> {
    // This node may have a new name or creation: local pids encode anew.
    encode::new_epoch();
    let plan = opts.plan(nodes, cookie)?;
    let caller = env.pid();
    let mut owned = OwnedEnv::new();
    let saved = owned.save(reference);
    runtime().spawn(async move {
        let started = plan.start().await;
        let _ = owned.send_and_clear(&caller, |env| {
            let r = saved.load(env);
            (atoms::ecall_cnode(), r, started_term(env, started)).encode(env)
        });
    });
    Ok(atoms::ok())
}

/// The identities to start: `cnode_start/4`'s arguments, checked.
struct Plan {
    nodes: Vec<String>,
    cookie: String,
    tick: Duration,
    handshake_timeout: Duration,
    epmd_port: u16,
    listen: Listen,
    tls: Option<ecall_dist::TlsOptions>,
    register_retry: Duration,
}

impl CNodeOpts {
    /// `badarg` for no node, a zero tick or handshake time, an address
    /// that does not parse, or a port range that is half given or empty.
    fn plan(self, nodes: Vec<String>, cookie: String) -> NifResult<Plan> {
        let addr = self
            .listen_addr
            .parse()
            .map_err(|_| rustler::Error::BadArg)?;
        if nodes.is_empty()
            || self.tick_ms == 0
            || self.handshake_ms == 0
            || (self.listen_min == 0) != (self.listen_max == 0)
            || self.listen_min > self.listen_max
        {
            return Err(rustler::Error::BadArg);
        }
        Ok(Plan {
            nodes,
            cookie,
            tick: Duration::from_millis(self.tick_ms),
            handshake_timeout: Duration::from_millis(self.handshake_ms),
            epmd_port: self.epmd_port,
            listen: Listen {
                addr,
                ports: (self.listen_min, self.listen_max),
            },
            tls: self.tls.then_some(ecall_dist::TlsOptions {
                certfile: self.tls_certfile,
                keyfile: self.tls_keyfile,
                cacertfile: self.tls_cacertfile,
                sni: self.tls_sni,
                server_certfile: self.tls_server_certfile,
                server_keyfile: self.tls_server_keyfile,
                server_cacertfile: self.tls_server_cacertfile,
            }),
            register_retry: Duration::from_millis(self.register_retry_ms),
        })
    }
}

impl Plan {
    /// Reads the TLS files (on a runtime thread: they may be slow), then
    /// starts the identities one after another; the first failure stops
    /// there (the identities started before it are dropped, which
    /// unregisters them).
    async fn start(self) -> Result<Vec<Arc<Identity>>, ecall_dist::Error> {
        let tls = self
            .tls
            .as_ref()
            .map(ecall_dist::TlsClient::new)
            .transpose()?;
        let mut ids = Vec::with_capacity(self.nodes.len());
        for node in self.nodes {
            let cfg = IdentityConfig {
                node,
                cookie: self.cookie.clone(),
                tick: self.tick,
                handshake_timeout: self.handshake_timeout,
                epmd_port: self.epmd_port,
                listen: self.listen.clone(),
                tls: tls.clone(),
                register_retry: self.register_retry,
            };
            ids.push(Identity::start(cfg).await?);
        }
        Ok(ids)
    }
}

/// `{ok, CNode}`, or `{error, Reason}`: `{name_taken, Node}`, the one
/// failure the Erlang side retries by name (and says what to do about),
/// or text.
fn started_term(env: Env<'_>, started: Result<Vec<Arc<Identity>>, ecall_dist::Error>) -> Term<'_> {
    match started {
        Ok(ids) => (atoms::ok(), ResourceArc::new(CNode { ids })).encode(env),
        Err(ecall_dist::Error::NameTaken(node)) => {
            (atoms::error(), (atoms::name_taken(), node)).encode(env)
        }
        Err(e) => (atoms::error(), e.to_string()).encode(env),
    }
}

/// One map per identity: `node` (binary), `creation`, `port`, incoming
/// connections `accepted`, `refused`, `handshakes_timed_out`, closed to
/// make room for newer ones (`handshakes_shed_idle`: before their name,
/// `handshakes_shed_stalled`: after it), and what they sent
/// (`inbound_frames`, `inbound_answered`, `inbound_ignored`, and
/// `inbound_malformed`: connections closed on a malformed frame).
#[rustler::nif]
fn cnode_info<'a>(env: Env<'a>, cnode: ResourceArc<CNode>) -> NifResult<Vec<Term<'a>>> {
    cnode
        .ids
        .iter()
        .map(|i| {
            let mut pairs = vec![
                (atoms::creation(), u64::from(i.creation().get())),
                (atoms::port(), u64::from(i.port())),
                (atoms::accepted(), i.accepted.load(Relaxed)),
                (atoms::refused(), i.refused.load(Relaxed)),
                (atoms::handshakes_timed_out(), i.timed_out.load(Relaxed)),
                (atoms::handshakes_shed_idle(), i.shed_idle.load(Relaxed)),
                (
                    atoms::handshakes_shed_stalled(),
                    i.shed_stalled.load(Relaxed),
                ),
                (atoms::accept_errors(), i.accept_errors.load(Relaxed)),
            ];
            pairs.extend(inbound_counters(&i.inbound));
            map_of(env, &pairs)?.map_put(atoms::node().encode(env), i.node().encode(env))
        })
        .collect()
}

/// What an identity's incoming connections sent, as `cnode_info/1` names it.
fn inbound_counters(s: &ecall_dist::InboundStats) -> [(Atom, u64); 4] {
    [
        (atoms::inbound_frames(), s.frames.load(Relaxed)),
        (atoms::inbound_answered(), s.answered.load(Relaxed)),
        (atoms::inbound_ignored(), s.ignored.load(Relaxed)),
        (atoms::inbound_malformed(), s.malformed.load(Relaxed)),
    ]
}
