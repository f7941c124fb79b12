//! The socket of a link: plain TCP, or TLS over TCP for a node whose
//! distribution runs over TLS (`-proto_dist inet_tls`; its configuration
//! is [`super::tls`]), split into a read half and a write half for the
//! link's reader and writer tasks.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_rustls::TlsStream;

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
    /// The TCP socket's descriptor (under TLS too), for tests that act on
    /// the socket itself: valid as long as either half of this stream
    /// lives.
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
