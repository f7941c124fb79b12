//! The handshake's framing under TLS: OTP's TLS distribution frames its
//! handshake messages with a 4-byte length, where erl_dist speaks the
//! 2-byte form of TCP distribution ([`Packet4`]).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// OTP's TLS distribution frames its handshake messages with a 4-byte
/// length (`{packet, 4}` in `inet_tls_dist`), where TCP distribution uses
/// 2 bytes; erl_dist speaks the 2-byte form. During the handshake only,
/// this adapter turns the 2-byte frames erl_dist writes into 4-byte ones,
/// and the 4-byte frames the peer sends into 2-byte ones. It reads one
/// frame at a time, so nothing past the handshake is left in it.
#[derive(Debug)]
pub(crate) struct Packet4<S> {
    inner: S,
    /// Off: bytes pass through untouched (plain TCP).
    on: bool,
    /// Bytes written by erl_dist, not yet a whole 2-byte frame.
    wbuf: Vec<u8>,
    /// 4-byte frames ready for the inner stream.
    out: Vec<u8>,
    /// The incoming frame being read: its 4-byte header, then its payload.
    rhdr: [u8; 4],
    rhdr_len: usize,
    rpayload: Vec<u8>,
    rpayload_len: usize,
    /// The frame rewritten for erl_dist, and how much of it was served.
    rready: Vec<u8>,
    rpos: usize,
}

impl<S> Packet4<S> {
    pub(crate) fn new(inner: S, on: bool) -> Self {
        Packet4 {
            inner,
            on,
            wbuf: Vec::new(),
            out: Vec::new(),
            rhdr: [0; 4],
            rhdr_len: 0,
            rpayload: Vec::new(),
            rpayload_len: 0,
            rready: Vec::new(),
            rpos: 0,
        }
    }

    pub(crate) fn into_inner(self) -> S {
        self.inner
    }
}

/// Reads more of `buf` from `filled` on: `Ok(false)` at end of stream.
fn poll_fill<S: AsyncRead + Unpin>(
    inner: &mut S,
    cx: &mut Context<'_>,
    buf: &mut [u8],
    filled: &mut usize,
) -> Poll<io::Result<bool>> {
    let mut rb = ReadBuf::new(&mut buf[*filled..]);
    match Pin::new(inner).poll_read(cx, &mut rb) {
        Poll::Ready(Ok(())) => {
            let n = rb.filled().len();
            *filled += n;
            Poll::Ready(Ok(n > 0))
        }
        Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
        Poll::Pending => Poll::Pending,
    }
}

/// Handshake messages are small; anything larger is not one.
const MAX_HANDSHAKE_FRAME: usize = 64 * 1024;

impl<S: AsyncRead + Unpin> AsyncRead for Packet4<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if !me.on {
            return Pin::new(&mut me.inner).poll_read(cx, buf);
        }
        loop {
            if me.rpos < me.rready.len() {
                let n = (me.rready.len() - me.rpos).min(buf.remaining());
                buf.put_slice(&me.rready[me.rpos..me.rpos + n]);
                me.rpos += n;
                return Poll::Ready(Ok(()));
            }
            if me.rhdr_len < 4 {
                match poll_fill(&mut me.inner, cx, &mut me.rhdr, &mut me.rhdr_len) {
                    // End of stream between frames: the reader sees it.
                    Poll::Ready(Ok(false)) if me.rhdr_len == 0 => return Poll::Ready(Ok(())),
                    Poll::Ready(Ok(false)) => {
                        return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()))
                    }
                    Poll::Ready(Ok(true)) => {}
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
                if me.rhdr_len == 4 {
                    let len = u32::from_be_bytes(me.rhdr) as usize;
                    if len > MAX_HANDSHAKE_FRAME {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "handshake frame too large",
                        )));
                    }
                    me.rpayload = vec![0; len];
                    me.rpayload_len = 0;
                }
                continue;
            }
            if me.rpayload_len < me.rpayload.len() {
                match poll_fill(&mut me.inner, cx, &mut me.rpayload, &mut me.rpayload_len) {
                    Poll::Ready(Ok(false)) => {
                        return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()))
                    }
                    Poll::Ready(Ok(true)) => continue,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
            }
            // A whole frame: serve it with a 2-byte length.
            let len = u16::try_from(me.rpayload.len()).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidData, "handshake frame too large")
            })?;
            me.rready.clear();
            me.rready.extend_from_slice(&len.to_be_bytes());
            me.rready.append(&mut me.rpayload);
            me.rpos = 0;
            me.rhdr_len = 0;
            me.rpayload_len = 0;
        }
    }
}

impl<S: AsyncWrite + Unpin> Packet4<S> {
    /// Writes what is in `out`; `Pending` until it is all written.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.out.is_empty() {
            match Pin::new(&mut self.inner).poll_write(cx, &self.out) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => {
                    self.out.drain(..n);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Packet4<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        if !me.on {
            return Pin::new(&mut me.inner).poll_write(cx, buf);
        }
        me.wbuf.extend_from_slice(buf);
        while me.wbuf.len() >= 2 {
            let len = usize::from(u16::from_be_bytes([me.wbuf[0], me.wbuf[1]]));
            if me.wbuf.len() < 2 + len {
                break;
            }
            me.out.extend_from_slice(&(len as u32).to_be_bytes());
            me.out.extend_from_slice(&me.wbuf[2..2 + len]);
            me.wbuf.drain(..2 + len);
        }
        // The bytes are taken either way; what the socket does not take
        // now goes at the next write or flush.
        if let Poll::Ready(Err(e)) = me.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        match me.poll_drain(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut me.inner).poll_flush(cx),
            other => other,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn packet4_rewrites_handshake_frames_both_ways() {
        let (ours, mut peer) = tokio::io::duplex(1024);
        let mut p = Packet4::new(ours, true);
        // What erl_dist writes (2-byte lengths, in pieces) reaches the peer
        // with 4-byte lengths.
        p.write_all(&[0, 3]).await.unwrap();
        p.write_all(b"abc").await.unwrap();
        p.flush().await.unwrap();
        let mut got = [0u8; 7];
        peer.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"\0\0\0\x03abc");
        // What the peer writes with 4-byte lengths reads with 2.
        peer.write_all(b"\0\0\0\x02hi\0\0\0\x01!").await.unwrap();
        let mut back = [0u8; 7];
        p.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"\0\x02hi\0\x01!");
        // Off: untouched.
        let (ours, mut peer) = tokio::io::duplex(64);
        let mut plain = Packet4::new(ours, false);
        plain.write_all(&[0, 1, 7]).await.unwrap();
        let mut same = [0u8; 3];
        peer.read_exact(&mut same).await.unwrap();
        assert_eq!(same, [0, 1, 7]);
    }

    #[tokio::test]
    async fn packet4_refuses_a_length_off_the_wire_past_the_bound() {
        let (ours, mut peer) = tokio::io::duplex(64);
        let mut p = Packet4::new(ours, true);
        peer.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
        let mut buf = [0u8; 2];
        let e = p.read_exact(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }
}
