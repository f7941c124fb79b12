//! What the NIF tells Erlang of a peer: its links' events, sent to the
//! peer's owner as they happen ([`Events`]), and its counters, read with
//! `peer_stats/1`.

use crate::{atoms, PeerRes};
use ecall_dist::{posix_name, LinkStats};
use ecall_dist::{LinkDown, LinkEvents};
use rustler::env::OwnedEnv;
use rustler::{Atom, Encoder, Env, LocalPid, NifResult, ResourceArc, Term};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A peer's link events, sent to its owner (`peer_open/6`) as
/// `{ecall_link, K, Event}`.
pub struct Events {
    /// The process that opened the peer.
    pub owner: LocalPid,
}

impl Events {
    fn tell(&self, link: usize, what: impl for<'a> FnOnce(Env<'a>) -> Term<'a>) {
        let mut env = OwnedEnv::new();
        let _ = env.send_and_clear(&self.owner, |env| {
            (atoms::ecall_link(), link, what(env)).encode(env)
        });
    }
}

impl LinkEvents for Events {
    fn up(&self, link: usize) {
        self.tell(link, |env| atoms::up().encode(env));
    }
    fn down(&self, link: usize, reason: &LinkDown) {
        let reason = reason.clone();
        self.tell(link, move |env| {
            (atoms::down(), down_reason(env, &reason)).encode(env)
        });
    }
    fn alive(&self, link: usize, node: &str) {
        let node = node.to_string();
        self.tell(link, move |env| (atoms::alive(), node).encode(env));
    }
    fn stopped(&self, link: usize) {
        self.tell(link, |env| atoms::stopped().encode(env));
    }
}

/// The Erlang term of a link-down reason, as sent in
/// `{ecall_link, K, {down, Reason}}` (what the link wrote and the peer did
/// not acknowledge goes again on the next connection):
///
/// ```text
/// Reason = closed              % the peer was closed (peer_close/1)
///        | stalled             % a write missed stall_timeout
///        | restarted           % the peer node has a new creation; the
///                              % link stopped for good
///        | alive               % the peer still holds our previous
///                              % connection ({alive, OurNode} came first)
///        | peer_closed         % the peer closed the socket
///        | not_registered      % the peer's epmd does not know its name
///        | handshake_timeout   % no connection within the handshake time
///        | {read, Posix}       % reading the socket failed
///        | {write, Posix}      % writing the socket failed
///        | {connect, Posix}    % the TCP connection to the peer failed
///        | {malformed, frame_too_large | unknown_frame_kind
///                    | bad_distribution_header | bad_term | bad_ack}
///        | {epmd, binary()}    % the peer's epmd failed (text)
///        | {handshake, binary()}  % the handshake failed (text; a wrong
///                                 % cookie shows up here)
/// Posix  = econnreset | epipe | econnrefused | econnaborted | enotconn
///        | etimedout | ehostunreach | enetunreach | eaddrnotavail
///        | eaddrinuse | enomem | other
/// ```
fn down_reason<'a>(env: Env<'a>, reason: &LinkDown) -> Term<'a> {
    // Atoms named by ecall_dist (errno names, malformed-frame names).
    let named = |name: &str| Atom::from_str(env, name).unwrap_or_else(|_| atoms::other());
    match reason {
        LinkDown::Closed => atoms::closed().encode(env),
        LinkDown::Stalled => atoms::stalled().encode(env),
        LinkDown::Restarted => atoms::restarted().encode(env),
        LinkDown::Alive => atoms::alive().encode(env),
        LinkDown::PeerClosed => atoms::peer_closed().encode(env),
        LinkDown::NotRegistered => atoms::not_registered().encode(env),
        LinkDown::HandshakeTimeout => atoms::handshake_timeout().encode(env),
        LinkDown::Read(k) => (atoms::read(), named(posix_name(*k))).encode(env),
        LinkDown::Write(k) => (atoms::write(), named(posix_name(*k))).encode(env),
        LinkDown::Connect(k) => (atoms::connect(), named(posix_name(*k))).encode(env),
        LinkDown::Malformed(m) => (atoms::malformed(), named(m.as_str())).encode(env),
        LinkDown::Epmd(s) => (atoms::epmd(), s.as_str()).encode(env),
        LinkDown::Handshake(s) => (atoms::handshake(), s.as_str()).encode(env),
    }
}

/// The map of `pairs`, atoms to counts.
pub fn map_of<'a>(env: Env<'a>, pairs: &[(Atom, u64)]) -> NifResult<Term<'a>> {
    let keys: Vec<Term> = pairs.iter().map(|(k, _)| k.encode(env)).collect();
    let vals: Vec<Term> = pairs.iter().map(|(_, v)| v.encode(env)).collect();
    Term::map_from_term_arrays(env, &keys, &vals)
}

/// Counters of a peer, as a map: totals, and `per_link`, one map per link.
#[rustler::nif]
fn peer_stats<'a>(env: Env<'a>, peer: ResourceArc<PeerRes>) -> NifResult<Term<'a>> {
    let p = &peer.peer;
    let s = p.stats();
    let links: Vec<&LinkStats> = (0..p.link_count())
        .filter_map(|k| p.link_stats(k))
        .collect();
    // The counters every link keeps; a peer's total is their sum.
    type Counter = fn(&LinkStats) -> &AtomicU64;
    let counters: [(Atom, Counter); 22] = [
        (atoms::batches(), |l| &l.batches),
        (atoms::requests(), |l| &l.requests),
        (atoms::bytes(), |l| &l.bytes),
        (atoms::writes(), |l| &l.writes),
        (atoms::dropped(), |l| &l.dropped),
        (atoms::replayed(), |l| &l.replayed),
        (atoms::replayed_requests(), |l| &l.replayed_requests),
        (atoms::acks(), |l| &l.acks),
        (atoms::connects(), |l| &l.connects),
        (atoms::disconnects(), |l| &l.disconnects),
        (atoms::stalls(), |l| &l.stalls),
        (atoms::fragmented(), |l| &l.fragmented),
        (atoms::lone(), |l| &l.lone),
        (atoms::lone_partial(), |l| &l.lone_partial),
        (atoms::gathers(), |l| &l.gathers),
        (atoms::flushes(), |l| &l.flushes),
        (atoms::flush_handoffs(), |l| &l.flush_handoffs),
        (atoms::urgent(), |l| &l.urgent),
        (atoms::inbound_frames(), |l| &l.inbound.frames),
        (atoms::inbound_answered(), |l| &l.inbound.answered),
        (atoms::inbound_ignored(), |l| &l.inbound.ignored),
        (atoms::inbound_malformed(), |l| &l.inbound.malformed),
    ];
    let per_link: Vec<Term> = links
        .iter()
        .enumerate()
        .map(|(k, l)| {
            let mut pairs: Vec<(Atom, u64)> = counters
                .iter()
                .map(|(k, f)| (*k, f(l).load(Relaxed)))
                .collect();
            pairs.push((atoms::up(), u64::from(l.up.load(Relaxed))));
            // Numbered from 1, as in logs, telemetry and the identities'
            // names (`<node>_ecall_<link>`).
            pairs.push((atoms::link(), k as u64 + 1));
            map_of(env, &pairs)
        })
        .collect::<NifResult<_>>()?;
    let mut totals: Vec<(Atom, u64)> = counters
        .iter()
        .map(|(k, f)| (*k, links.iter().map(|l| f(l).load(Relaxed)).sum()))
        .collect();
    totals.extend([
        // Queued when the whole peer closed: no link's doing.
        (atoms::closed_drops(), s.dropped.load(Relaxed)),
        // Written, not acknowledged when the peer closed.
        (atoms::unconfirmed(), s.unconfirmed.load(Relaxed)),
        (atoms::retained_bytes(), p.retained_bytes() as u64),
        (atoms::pushed(), s.pushed.load(Relaxed)),
        (atoms::full(), s.full.load(Relaxed)),
        (atoms::overflow_waits(), s.waits.load(Relaxed)),
        (atoms::wakes(), s.wakes.load(Relaxed)),
        (atoms::overflow_drops(), s.overflow_drops.load(Relaxed)),
        (atoms::cached_atoms(), s.cached_atoms.load(Relaxed)),
        (atoms::queued_bytes(), p.queued_bytes() as u64),
        (atoms::links_up(), s.links_up.load(Relaxed) as u64),
        (atoms::links(), p.link_count() as u64),
        (atoms::shards(), p.shard_count() as u64),
    ]);
    map_of(env, &totals)?.map_put(atoms::per_link().encode(env), per_link.encode(env))
}
