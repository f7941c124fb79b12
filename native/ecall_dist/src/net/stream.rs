//! The socket of a link: plain TCP, or TLS over TCP for a node whose
//! distribution runs over TLS (`-proto_dist inet_tls`).
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
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
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

/// A link's socket.
#[derive(Debug)]
pub enum LinkStream {
    /// Plain TCP.
    Tcp(TcpStream),
    /// TLS over TCP.
    Tls(Box<TlsStream<TcpStream>>),
}

/// The read half of a [`LinkStream`].
#[derive(Debug)]
pub enum LinkRead {
    /// Of plain TCP.
    Tcp(OwnedReadHalf),
    /// Of TLS.
    Tls(ReadHalf<TlsStream<TcpStream>>),
}

/// The write half of a [`LinkStream`].
#[derive(Debug)]
pub enum LinkWrite {
    /// Of plain TCP.
    Tcp(OwnedWriteHalf),
    /// Of TLS, and whether TLS holds records that a non-blocking write
    /// ([`LinkWrite::try_write`]) could not hand to the socket.
    Tls(WriteHalf<TlsStream<TcpStream>>, bool),
}

impl LinkStream {
    /// The TCP socket's descriptor (under TLS too), for [`unacked`]: valid
    /// as long as either half of this stream lives.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        match self {
            LinkStream::Tcp(s) => s.as_raw_fd(),
            LinkStream::Tls(s) => s.get_ref().0.as_raw_fd(),
        }
    }

    /// The two halves, for the link's reader and writer tasks.
    pub fn into_split(self) -> (LinkRead, LinkWrite) {
        match self {
            LinkStream::Tcp(s) => {
                let (r, w) = s.into_split();
                (LinkRead::Tcp(r), LinkWrite::Tcp(w))
            }
            LinkStream::Tls(s) => {
                let (r, w) = tokio::io::split(*s);
                (LinkRead::Tls(r), LinkWrite::Tls(w, false))
            }
        }
    }
}

impl LinkWrite {
    /// A non-blocking write from any thread (a lone write or a flush:
    /// link/lent_side.rs): the bytes taken, or `WouldBlock`. Under TLS the
    /// bytes go through the connection's TLS state, which the reader
    /// shares under the split's lock: when the reader holds it, or TLS
    /// cannot take the bytes now, this is `WouldBlock` too. The records of
    /// what was taken go to the socket as far as it takes them; what it
    /// does not take stays with TLS ([`LinkWrite::unsent`]), for the
    /// writer's next write or flush.
    pub(crate) fn try_write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            LinkWrite::Tcp(w) => w.try_write(buf),
            LinkWrite::Tls(w, unsent) => {
                let mut cx = Context::from_waker(noop_waker());
                let n = match Pin::new(&mut *w).poll_write(&mut cx, buf) {
                    Poll::Ready(r) => r?,
                    Poll::Pending => return Err(io::ErrorKind::WouldBlock.into()),
                };
                *unsent = !matches!(Pin::new(&mut *w).poll_flush(&mut cx), Poll::Ready(Ok(())));
                Ok(n)
            }
        }
    }

    /// Whether TLS holds records a non-blocking write left unsent: the
    /// writer flushes before anything else.
    pub(crate) fn unsent(&self) -> bool {
        matches!(self, LinkWrite::Tls(_, true))
    }

    /// Notes that the writer flushed (see [`LinkWrite::unsent`]).
    pub(crate) fn flushed(&mut self) {
        if let LinkWrite::Tls(_, unsent) = self {
            *unsent = false;
        }
    }
}

/// A waker that does nothing: a non-blocking write polls once and does not
/// wait (the writer, woken for what is left, registers its own).
fn noop_waker() -> &'static std::task::Waker {
    struct Noop;
    impl std::task::Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }
    static WAKER: std::sync::OnceLock<std::task::Waker> = std::sync::OnceLock::new();
    WAKER.get_or_init(|| std::task::Waker::from(Arc::new(Noop)))
}

/// Bytes written to TCP socket `fd` that its peer has not acknowledged
/// (Linux's `SIOCOUTQ`), or `None` where the kernel does not say. The
/// caller must hold the socket open (a half of its [`LinkStream`]).
#[allow(unsafe_code)]
pub(crate) fn unacked(fd: std::os::fd::RawFd) -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let mut n: libc::c_int = 0;
        // SAFETY: `fd` is an open socket for the duration of the call (the
        // caller holds it), and SIOCOUTQ (TIOCOUTQ on a socket) writes one
        // int, to `n`, which lives across the call.
        let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n as *mut libc::c_int) };
        if r == 0 {
            u64::try_from(n).ok()
        } else {
            None
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = fd;
        None
    }
}

macro_rules! delegate_read {
    ($t:ty) => {
        impl AsyncRead for $t {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Tcp(s) => Pin::new(s).poll_read(cx, buf),
                    Self::Tls(s) => Pin::new(s).poll_read(cx, buf),
                }
            }
        }
    };
}

macro_rules! delegate_write {
    ($t:ty) => {
        impl AsyncWrite for $t {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    Self::Tcp(s) => Pin::new(s).poll_write(cx, buf),
                    Self::Tls(s, ..) => Pin::new(s).poll_write(cx, buf),
                }
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    Self::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
                    Self::Tls(s, ..) => Pin::new(s).poll_write_vectored(cx, bufs),
                }
            }

            fn is_write_vectored(&self) -> bool {
                match self {
                    Self::Tcp(s) => s.is_write_vectored(),
                    Self::Tls(s, ..) => s.is_write_vectored(),
                }
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Tcp(s) => Pin::new(s).poll_flush(cx),
                    Self::Tls(s, ..) => Pin::new(s).poll_flush(cx),
                }
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Tcp(s) => Pin::new(s).poll_shutdown(cx),
                    Self::Tls(s, ..) => Pin::new(s).poll_shutdown(cx),
                }
            }
        }
    };
}

delegate_read!(LinkStream);
delegate_read!(LinkRead);
delegate_write!(LinkStream);
delegate_write!(LinkWrite);
