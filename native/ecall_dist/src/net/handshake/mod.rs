//! The distribution handshake, both sides, on a connection already made
//! (TCP, or TLS over it): erl_dist's handshake, under the 4-byte framing
//! of OTP's TLS distribution when the stream is TLS ([`packet4`]).

mod packet4;

use crate::error::Error;
use crate::net::connect::Connected;
use crate::net::pending::Slot;
use crate::net::stream::LinkStream;
use crate::wire::dist_flags::{link_flags, missing_flags, DIST_HDR_ATOM_CACHE, FRAGMENTS};
use erl_dist::handshake::ServerSideHandshake;
use erl_dist::handshake::{ClientSideHandshake, HandshakeError, HandshakeStatus};
use erl_dist::node::LocalNode;
use packet4::Packet4;
use tokio_util::compat::TokioAsyncReadCompatExt;

/// The server side, on an incoming connection, as `local` with `cookie`:
/// the stream and the peer's name, or why the handshake failed. `slot`
/// is told when the peer has sent its name.
pub(crate) async fn server(
    local: LocalNode,
    cookie: &str,
    stream: LinkStream,
    slot: &Slot,
) -> Result<(LinkStream, String), String> {
    // OTP's TLS distribution frames handshake messages with 4 bytes.
    let tls = matches!(stream, LinkStream::Tls(_));
    let stream = Packet4::new(stream, tls);
    let mut hs = ServerSideHandshake::new(stream.compat(), local, cookie);
    match hs.execute_recv_name().await.map_err(|e| e.to_string())? {
        Some(_) => {}
        None => return Err("peer asked for a dynamic name".into()),
    }
    slot.named();
    let (stream, peer) = hs
        .execute_rest(HandshakeStatus::Ok)
        .await
        .map_err(|e| e.to_string())?;
    Ok((stream.into_inner().into_inner(), peer.name.to_string()))
}

/// The client side, on a connection made to a peer, as `local` (offering
/// the links' flags) with `cookie`. A peer that lacks a flag the links
/// need is refused, by name.
///
/// Errors: [`Error::Handshake`] and [`Error::Alive`].
pub(crate) async fn client(
    mut local: LocalNode,
    cookie: &str,
    stream: LinkStream,
) -> Result<Connected, Error> {
    local.flags = link_flags();
    let offered = local.flags.bits();
    // OTP's TLS distribution frames handshake messages with 4 bytes.
    let tls = matches!(stream, LinkStream::Tls(_));
    let stream = Packet4::new(stream, tls);
    let mut hs = ClientSideHandshake::new(stream.compat(), local, cookie);
    let status = hs
        .execute_send_name(erl_dist::LOWEST_DISTRIBUTION_PROTOCOL_VERSION)
        .await
        .map_err(|e| Error::Handshake(e.to_string()))?;
    if status == HandshakeStatus::Alive {
        // erl_dist 0.8 never finishes a handshake continued after `alive`
        // (it waits for a message that never comes, until the peer times
        // out after about 7 s): decline, and let the owner ask the peer to drop
        // the stale connection before the next attempt.
        let _ = hs.execute_rest(false).await;
        return Err(Error::Alive);
    }
    let (stream, peer) = hs.execute_rest(true).await.map_err(|e| match e {
        // A wrong cookie shows up on the client side only as an early EOF.
        HandshakeError::Io(ref io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            Error::Handshake(format!("{e} (wrong cookie?)"))
        }
        e => Error::Handshake(e.to_string()),
    })?;
    let missing = missing_flags(peer.flags.bits());
    if !missing.is_empty() {
        // Dropping the stream closes the connection before anything is
        // written on it.
        return Err(Error::Handshake(format!(
            "refused: the peer lacks {} (needed by ecall's links)",
            missing.join(", ")
        )));
    }
    Ok(Connected {
        stream: stream.into_inner().into_inner(),
        creation: peer.creation.map_or(0, |c| c.get()),
        // Both sides' flags decide, as in OTP's handshake.
        atom_cache: offered & peer.flags.bits() & DIST_HDR_ATOM_CACHE != 0,
        fragments: offered & peer.flags.bits() & FRAGMENTS != 0,
    })
}
