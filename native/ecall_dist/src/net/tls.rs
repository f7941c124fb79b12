//! TLS for the links and the identities' listener, for a node whose
//! distribution runs over TLS (`-proto_dist inet_tls`): the options
//! understood and the configurations made from them, certificates and
//! keys read from their files.
//!
//! The links connect out to the peer's TLS distribution listener,
//! presenting the node's certificate (OTP's TLS distribution asks for one)
//! and checking the peer's against the CA certificates, as the node's own
//! client options say; the identities' listener (pings, `is_auth`) accepts
//! TLS with the node's server certificate, key and CAs (the client's where
//! the server's are not given), asking for a client certificate that
//! chains to those CAs. Only those options are
//! understood ([`TlsOptions`]); the Erlang side refuses the others before
//! it starts any identity.

use crate::error::Error;
use crate::net::stream::LinkStream;
use std::io;
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::rustls;
use tokio_rustls::TlsStream;

/// The TLS client options the links understand (OTP's names): the node's
/// certificate and key, and the CA certificates its peers' certificates
/// must chain to. Verification is always on (`verify_peer`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// `certfile`: the node's certificate chain (PEM).
    pub certfile: String,
    /// `keyfile`: its private key (PEM); the certfile's when empty.
    pub keyfile: String,
    /// `cacertfile`: trusted CA certificates (PEM).
    pub cacertfile: String,
    /// `server_name_indication`: whether the peer's host name is sent.
    pub sni: bool,
    /// The node's server options for the identities' listener: its
    /// `certfile`, `keyfile` and `cacertfile`; each empty one is the
    /// client's.
    pub server_certfile: String,
    /// See `server_certfile`.
    pub server_keyfile: String,
    /// See `server_certfile`.
    pub server_cacertfile: String,
}

impl TlsOptions {
    /// The listener's certificate, key and CA files: the server options
    /// where given, else the client's. A server key goes with a server
    /// certificate only (an empty one: the key is in that certfile).
    fn server_files(&self) -> (&str, &str, &str) {
        let ca = first_set(&self.server_cacertfile, &self.cacertfile);
        if self.server_certfile.is_empty() {
            (&self.certfile, &self.keyfile, ca)
        } else {
            (&self.server_certfile, &self.server_keyfile, ca)
        }
    }
}

fn first_set<'a>(a: &'a str, b: &'a str) -> &'a str {
    if a.is_empty() {
        b
    } else {
        a
    }
}

/// TLS configurations made from [`TlsOptions`]: the links' client side,
/// and the identities' listener, which asks for (and checks) a client
/// certificate as OTP's TLS distribution does.
#[derive(Clone)]
pub struct TlsClient {
    connector: tokio_rustls::TlsConnector,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsClient")
    }
}

impl TlsClient {
    /// Reads the certificates and the keys; fails with what is wrong.
    pub fn new(opts: &TlsOptions) -> Result<TlsClient, Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let (chain, key) = pem_identity(&opts.certfile, &opts.keyfile)?;
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Config(format!("TLS: {e}")))?
            .with_root_certificates(Arc::new(pem_roots(&opts.cacertfile)?))
            .with_client_auth_cert(chain, key)
            .map_err(|e| Error::Config(format!("certfile {}: {e}", opts.certfile)))?;
        config.enable_sni = opts.sni;
        // The listener: the node's server files, asking for a client
        // certificate from its CAs (OTP's `fail_if_no_peer_cert').
        let (certfile, keyfile, cacertfile) = opts.server_files();
        let (chain, key) = pem_identity(certfile, keyfile)?;
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(pem_roots(cacertfile)?),
            Arc::clone(&provider),
        )
        .build()
        .map_err(|e| Error::Config(format!("cacertfile {cacertfile}: {e}")))?;
        let server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Config(format!("TLS: {e}")))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(|e| Error::Config(format!("certfile {certfile}: {e}")))?;
        Ok(TlsClient {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
        })
    }

    /// TLS over `tcp` to `host`, whose certificate must name it.
    pub(crate) async fn connect(&self, host: &str, tcp: TcpStream) -> Result<LinkStream, Error> {
        let name = rustls::pki_types::ServerName::try_from(host.to_string())
            .map_err(|e| Error::Handshake(format!("TLS: server name {host}: {e}")))?;
        let tls = self
            .connector
            .connect(name, tcp)
            .await
            .map_err(|e| Error::Handshake(format!("TLS: {e}")))?;
        Ok(LinkStream::Tls(Box::new(TlsStream::Client(tls))))
    }

    /// The server side of TLS over an accepted `tcp`.
    pub(crate) async fn accept(&self, tcp: TcpStream) -> Result<LinkStream, String> {
        let tls = self
            .acceptor
            .accept(tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        Ok(LinkStream::Tls(Box::new(TlsStream::Server(tls))))
    }
}

/// The CA certificates of `path`.
fn pem_roots(path: &str) -> Result<rustls::RootCertStore, Error> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in pem_certs(path)? {
        roots
            .add(cert)
            .map_err(|e| Error::Config(format!("cacertfile {path}: {e}")))?;
    }
    Ok(roots)
}

/// A certificate chain and its private key (from `certfile` when
/// `keyfile` is empty).
fn pem_identity(
    certfile: &str,
    keyfile: &str,
) -> Result<
    (
        Vec<rustls::pki_types::CertificateDer<'static>>,
        rustls::pki_types::PrivateKeyDer<'static>,
    ),
    Error,
> {
    let chain = pem_certs(certfile)?;
    let keyfile = first_set(keyfile, certfile);
    let key = rustls_pemfile::private_key(&mut pem_reader(keyfile)?)
        .map_err(|e| Error::Config(format!("keyfile {keyfile}: {e}")))?
        .ok_or_else(|| Error::Config(format!("keyfile {keyfile}: no private key")))?;
    Ok((chain, key))
}

fn pem_reader(path: &str) -> Result<io::BufReader<std::fs::File>, Error> {
    std::fs::File::open(path)
        .map(io::BufReader::new)
        .map_err(|e| Error::Config(format!("{path}: {e}")))
}

fn pem_certs(path: &str) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, Error> {
    let certs: Vec<_> = rustls_pemfile::certs(&mut pem_reader(path)?)
        .collect::<Result<_, _>>()
        .map_err(|e| Error::Config(format!("{path}: {e}")))?;
    if certs.is_empty() {
        return Err(Error::Config(format!("{path}: no certificate")));
    }
    Ok(certs)
}
