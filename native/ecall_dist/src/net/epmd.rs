//! epmd, the port mapper: registering an identity's name with the local
//! epmd, and looking up a peer's distribution port with the epmd of its
//! host.

use crate::error::Error;
use erl_dist::epmd::{EpmdClient, EpmdError, NodeEntry};
use erl_dist::node::{Creation, NodeName};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_util::compat::{Compat, TokioAsyncReadCompatExt};

/// Registers `name` (`node` in full, for errors and logs) as a hidden node
/// listening on `port` with the epmd on `epmd_port`; returns the connection
/// that keeps it registered and the creation. epmd forgets a name when the
/// connection that registered it closes, which it notices a little after
/// the close: a node whose ecall restarts at once can find its old names
/// still taken. Registration is retried for `retry`, every 100 ms, for
/// that case; a name still taken after that is [`Error::NameTaken`] (the
/// Erlang side goes on without the identities and retries with backoff).
pub(crate) async fn register(
    node: &str,
    name: &NodeName,
    port: u16,
    epmd_port: u16,
    retry: Duration,
) -> Result<(Compat<TcpStream>, Creation), Error> {
    const RETRY_EVERY: Duration = Duration::from_millis(100);
    let t0 = tokio::time::Instant::now();
    loop {
        let epmd = TcpStream::connect(("127.0.0.1", epmd_port))
            .await
            .map_err(Error::io("connect to epmd"))?;
        match EpmdClient::new(epmd.compat())
            .register(NodeEntry::new_hidden(name.name(), port))
            .await
        {
            Ok(registered) => return Ok(registered),
            Err(e) if t0.elapsed() < retry => {
                tracing::debug!(node, error = %e, "epmd refused the name; retrying");
                tokio::time::sleep(RETRY_EVERY).await;
            }
            Err(EpmdError::RegisterNodeError { .. }) => {
                return Err(Error::NameTaken(node.to_string()))
            }
            Err(e) => return Err(Error::Epmd(format!("register {node}: {e}"))),
        }
    }
}

/// The distribution port of `peer` (`name`, parsed), from the epmd on
/// `epmd_port` of its host. Errors: [`Error::Epmd`] for anything about
/// that epmd (its socket included), [`Error::NotRegistered`].
pub(crate) async fn lookup(name: &NodeName, peer: &str, epmd_port: u16) -> Result<u16, Error> {
    let epmd = TcpStream::connect((name.host(), epmd_port))
        .await
        .map_err(|e| Error::Epmd(format!("connect to {}:{}: {e}", name.host(), epmd_port)))?;
    let entry = EpmdClient::new(epmd.compat())
        .get_node(name.name())
        .await
        .map_err(|e| Error::Epmd(format!("look up {peer}: {e}")))?
        .ok_or_else(|| Error::NotRegistered(peer.to_string()))?;
    Ok(entry.port)
}
