//! Socket writes with a stall deadline.
//!
//! [`write_all_vectored`]: every buffer, in order, in as few vectored
//! writes as the socket allows, and a deadline that reaps a peer that
//! stopped draining without cutting off one that is merely slow.

use std::io::IoSlice;
use std::time::Duration;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

/// Bytes that must reach the socket within one stall deadline. Bounding
/// the piece, not the whole write, keeps the deadline a minimum-throughput
/// floor (a piece per `stall_timeout`) instead of a limit on write size,
/// so a slow but live peer is never taken for a stalled one.
pub const STALL_PIECE: usize = 256 * 1024;

/// Most slices handed to one vectored write (Linux's `UIO_MAXIOV` is 1024;
/// a few dozen already fill any socket buffer).
const MAX_SLICES: usize = 64;

/// Writes every buffer, in order, with as few syscalls as the socket
/// allows. With a `stall` deadline, every [`STALL_PIECE`] bytes must be
/// taken within it (the timer is armed per syscall and dropped when it
/// returns: nothing sweeps). `Err(None)`: stalled. `taken` adds the bytes
/// the socket took, also when it fails part way.
pub async fn write_all_vectored<W: AsyncWrite + Unpin>(
    wr: &mut W,
    bufs: &[&[u8]],
    stall: Option<Duration>,
    taken: &mut u64,
) -> Result<(), Option<std::io::Error>> {
    let (mut i, mut off) = (0usize, 0usize);
    let mut piece_left = STALL_PIECE;
    let mut piece_due = stall.map(|d| Instant::now() + d);
    while i < bufs.len() {
        let mut slices = Vec::with_capacity((bufs.len() - i).min(MAX_SLICES));
        slices.push(IoSlice::new(&bufs[i][off..]));
        slices.extend(
            bufs[i + 1..]
                .iter()
                .take(MAX_SLICES - 1)
                .map(|b| IoSlice::new(b)),
        );
        let write = wr.write_vectored(&slices);
        let mut n = match piece_due {
            Some(due) => match tokio::time::timeout_at(due, write).await {
                Ok(r) => r.map_err(Some)?,
                Err(_) => return Err(None),
            },
            None => write.await.map_err(Some)?,
        };
        if n == 0 {
            return Err(Some(std::io::ErrorKind::WriteZero.into()));
        }
        *taken += n as u64;
        if n >= piece_left {
            piece_left = STALL_PIECE;
            piece_due = stall.map(|d| Instant::now() + d);
        } else {
            piece_left -= n;
        }
        while n > 0 && i < bufs.len() {
            let rem = bufs[i].len() - off;
            if n >= rem {
                n -= rem;
                i += 1;
                off = 0;
            } else {
                off += n;
                n = 0;
            }
        }
        while i < bufs.len() && bufs[i].len() == off {
            i += 1;
            off = 0;
        }
    }
    // TLS keeps what it was given until flushed (plain TCP: nothing to do).
    let flush = wr.flush();
    match piece_due {
        Some(due) => match tokio::time::timeout_at(due, flush).await {
            Ok(r) => r.map_err(Some)?,
            Err(_) => return Err(None),
        },
        None => flush.await.map_err(Some)?,
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A socket that takes at most a few bytes per write, says "not now"
    /// every third call (waking itself, as a socket that becomes writable
    /// again would), or never takes anything at all.
    #[derive(Default)]
    pub(crate) struct Trickle {
        pub(crate) got: Vec<u8>,
        calls: usize,
        pendings: usize,
        /// Most slices seen in one call.
        widest: usize,
        pub(crate) never: bool,
        zero: bool,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.poll_write_vectored(cx, &[IoSlice::new(buf)])
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let me = &mut *self;
            me.calls += 1;
            me.widest = me.widest.max(bufs.len());
            if me.never {
                // Never writable, and nothing will say otherwise: only a
                // timer can end the wait.
                return Poll::Pending;
            }
            if me.zero {
                return Poll::Ready(Ok(0));
            }
            if me.calls % 3 == 2 {
                me.pendings += 1;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            // 1 to 7 bytes, across slice boundaries.
            let mut budget = 1 + me.calls % 7;
            let mut n = 0;
            for b in bufs {
                let take = budget.min(b.len());
                me.got.extend_from_slice(&b[..take]);
                n += take;
                budget -= take;
                if budget == 0 {
                    break;
                }
            }
            Poll::Ready(Ok(n))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }
    }

    /// Partial writes and "not now" answers: every slice arrives, whole and
    /// in order, empty ones and more slices than one call takes included.
    #[tokio::test]
    async fn partial_writes_deliver_every_slice_in_order() {
        let owned: Vec<Vec<u8>> = (0..100u8)
            .map(|i| (0..usize::from(i % 13)).map(|j| i ^ j as u8).collect())
            .collect();
        let bufs: Vec<&[u8]> = owned.iter().map(|b| b.as_slice()).collect();
        let want: Vec<u8> = owned.concat();
        for stall in [None, Some(Duration::from_secs(10))] {
            let mut w = Trickle::default();
            let mut taken = 0;
            write_all_vectored(&mut w, &bufs, stall, &mut taken)
                .await
                .unwrap();
            assert_eq!(w.got, want);
            assert_eq!(taken, want.len() as u64);
            assert!(w.pendings > 0 && w.calls > bufs.len() / 2);
            assert!(w.widest <= MAX_SLICES);
        }
    }

    /// A socket that never takes a byte: the write ends at the deadline,
    /// as a stall, and is counted as one.
    #[tokio::test]
    async fn a_writer_that_takes_nothing_misses_the_deadline() {
        let deadline = Duration::from_millis(50);
        let mut w = Trickle {
            never: true,
            ..Trickle::default()
        };
        let t0 = Instant::now();
        let mut taken = 0;
        let r = write_all_vectored(&mut w, &[b"abc"], Some(deadline), &mut taken).await;
        assert!(matches!(r, Err(None)));
        assert_eq!(taken, 0);
        assert!(t0.elapsed() >= deadline);
        assert!(w.got.is_empty());

        // A socket that takes zero bytes fails at once instead.
        let mut w = Trickle {
            zero: true,
            ..Trickle::default()
        };
        let r = write_all_vectored(&mut w, &[b"abc"], Some(deadline), &mut taken).await;
        assert!(matches!(r, Err(Some(e)) if e.kind() == io::ErrorKind::WriteZero));
    }
}
