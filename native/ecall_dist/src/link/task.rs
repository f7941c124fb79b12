//! The task of one link: connect, run, report, back off, again.

use super::backoff::Backoff;
use super::writer::LinkWriter;
use super::PeerState;
use super::{LinkDown, LinkEvents};
use crate::error::Error;
use crate::net::connect::{self, Connected};
use crate::net::identity::Identity;
use crate::net::inbound;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Runs link `k` of `peer` under identity `id` until the peer closes (or
/// is dropped), it has drained, or the peer node turns out to have
/// restarted; then says so
/// ([`LinkEvents::stopped`]).
pub(crate) async fn link_task(
    peer: Arc<PeerState>,
    k: usize,
    id: Arc<Identity>,
    events: Arc<dyn LinkEvents>,
) {
    run_link(peer, k, id, Arc::clone(&events)).await;
    events.stopped(k);
}

async fn run_link(peer: Arc<PeerState>, k: usize, id: Arc<Identity>, events: Arc<dyn LinkEvents>) {
    let mut backoff = Backoff::new(peer.config.backoff_min, peer.config.backoff_max);
    let cancel = peer.cancel.clone();
    // Only the weak side is kept across waits so that a peer nobody holds
    // any more can be dropped (which closes it).
    let weak = Arc::downgrade(&peer);
    drop(peer);
    loop {
        let Some(peer) = weak.upgrade() else { return };
        if peer.is_closed() || drained(&peer, k) {
            return;
        }
        let attempt = tokio::time::timeout(
            id.handshake_timeout(),
            connect::connect(&id, &peer.config.node, &peer.config.cookie),
        );
        let result = tokio::select! {
            _ = cancel.cancelled() => return,
            // A drain with nothing for this link ends an attempt; with
            // something, the attempt goes on, to write it.
            _ = drain_idle(&peer, k) => return,
            r = attempt => r,
        };
        let result = result.map(|r| r.and_then(|c| peer.same_incarnation(c.creation).map(|_| c)));
        let reason = match result {
            Ok(Err(Error::Restarted)) => {
                peer.links[k]
                    .stats
                    .disconnects
                    .fetch_add(1, Ordering::Relaxed);
                let reason = LinkDown::Restarted;
                // Links are numbered from 1 in logs, as the identities are.
                // The owner logs the event (one line per event, ecall_conn).
                tracing::debug!(peer = peer.node(), link = k + 1, %reason, "link stopped");
                events.down(k, &reason);
                return;
            }
            Ok(Ok(conn)) => {
                backoff.connected();
                let ls = &peer.links[k].stats;
                ls.connects.fetch_add(1, Ordering::Relaxed);
                peer.stats.links_up.fetch_add(1, Ordering::Relaxed);
                ls.up.store(true, Ordering::Relaxed);
                events.up(k);
                let ended = connected(&peer, k, &id, conn).await;
                peer.links[k].stats.up.store(false, Ordering::Relaxed);
                peer.stats.links_up.fetch_sub(1, Ordering::Relaxed);
                // What it wrote and the peer did not acknowledge goes
                // again, first, on the next connection.
                peer.rewind_link(k);
                ended
            }
            Ok(Err(Error::Alive)) => {
                events.alive(k, id.node());
                LinkDown::Alive
            }
            Ok(Err(e)) => LinkDown::from_attempt(e),
            Err(_) => LinkDown::HandshakeTimeout,
        };
        if peer.is_closed() || drained(&peer, k) {
            return;
        }
        peer.links[k]
            .stats
            .disconnects
            .fetch_add(1, Ordering::Relaxed);
        // The owner logs the event (one line per event, ecall_conn).
        tracing::debug!(peer = peer.node(), link = k + 1, %reason, "link down");
        events.down(k, &reason);
        // A drain that starts during the backoff ends it: the link tries
        // at once to write what it holds (once: a drain under way does
        // not shorten the backoffs after).
        let (drain, draining) = (peer.drain.clone(), peer.is_draining());
        drop(peer);
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = drain.cancelled(), if !draining => {}
            _ = tokio::time::sleep(backoff.wait()) => {}
        }
    }
}

/// Whether the peer drains and link `k` has nothing left to write (then
/// it never will: `PeerState::drain`).
fn drained(peer: &PeerState, k: usize) -> bool {
    peer.is_draining() && peer.link_is_empty(k)
}

/// Returns once the peer drains with nothing for link `k`; never if the
/// link has something to write.
async fn drain_idle(peer: &PeerState, k: usize) {
    peer.drain.cancelled().await;
    if !peer.link_is_empty(k) {
        std::future::pending::<()>().await;
    }
}

/// Runs one connected link until it fails or the peer closes; returns why.
async fn connected(peer: &Arc<PeerState>, k: usize, id: &Identity, conn: Connected) -> LinkDown {
    let (mut rd, wr) = conn.stream.into_split();
    let (ctl_tx, ctl_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    let reading = Arc::clone(peer);
    let reader = tokio::spawn(async move {
        let stats = &reading.links[k].stats.inbound;
        let ack = |epoch, shard, seq| reading.ack(k, epoch, shard, seq);
        LinkDown::from_read(inbound::read_loop(&mut rd, ctl_tx, stats, &ack).await)
    });
    LinkWriter::new(
        Arc::clone(peer),
        k,
        wr,
        id.tick(),
        conn.atom_cache,
        conn.fragments,
    )
    .run(reader, ctl_rx)
    .await
}
