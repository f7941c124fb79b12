//! Connecting out to a peer under an identity: its port from the epmd of
//! its host ([`super::epmd`]), the TCP connection (and TLS over it), and
//! the client side of the handshake ([`super::handshake`]).

use crate::error::Error;
use crate::net::epmd;
use crate::net::handshake;
use crate::net::identity::Identity;
use erl_dist::node::NodeName;
use tokio::net::TcpStream;

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
