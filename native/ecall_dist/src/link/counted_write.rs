//! A link's socket writes: [`write_all_vectored`] with the link's stall
//! deadline, counted in its stats.

use super::{LinkDown, LinkStats};
use crate::net::stall_write::write_all_vectored;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::io::AsyncWrite;

/// Writes `bufs` with [`write_all_vectored`] and counts the write in `ls`;
/// a missed deadline is counted as a stall and ends the link as
/// [`LinkDown::Stalled`].
pub(crate) async fn write_with_deadline<W: AsyncWrite + Unpin>(
    ls: &LinkStats,
    wr: &mut W,
    bufs: &[&[u8]],
    deadline: Option<Duration>,
) -> Result<(), LinkDown> {
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    let mut taken = 0;
    match write_all_vectored(wr, bufs, deadline, &mut taken).await {
        Ok(()) => {}
        Err(None) => {
            ls.stalls.fetch_add(1, Ordering::Relaxed);
            return Err(LinkDown::Stalled);
        }
        Err(Some(e)) => return Err(LinkDown::Write(e.kind())),
    }
    ls.writes.fetch_add(1, Ordering::Relaxed);
    ls.bytes.fetch_add(total as u64, Ordering::Relaxed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::stall_write::tests::Trickle;

    /// The wrapper counts a write in the link's stats.
    #[tokio::test]
    async fn a_write_is_counted_and_logged() {
        let owned: Vec<Vec<u8>> = (0..100u8).map(|i| vec![i; usize::from(i % 13)]).collect();
        let bufs: Vec<&[u8]> = owned.iter().map(|b| b.as_slice()).collect();
        let want: Vec<u8> = owned.concat();
        let (ls, mut w) = (LinkStats::default(), Trickle::default());
        write_with_deadline(&ls, &mut w, &bufs, Some(Duration::from_secs(10)))
            .await
            .unwrap();
        assert_eq!(w.got, want);
        assert_eq!(ls.writes.load(Ordering::Relaxed), 1);
        assert_eq!(ls.bytes.load(Ordering::Relaxed), want.len() as u64);
        assert_eq!(ls.stalls.load(Ordering::Relaxed), 0);
    }

    /// A socket that never takes a byte: the link goes down as stalled,
    /// counted as a stall and not as a write.
    #[tokio::test]
    async fn a_missed_deadline_is_a_stall() {
        let mut w = Trickle::default();
        w.never = true;
        let ls = LinkStats::default();
        let deadline = Some(Duration::from_millis(50));
        let r = write_with_deadline(&ls, &mut w, &[b"abc"], deadline).await;
        assert_eq!(r, Err(LinkDown::Stalled));
        assert_eq!(ls.stalls.load(Ordering::Relaxed), 1);
        assert_eq!(ls.writes.load(Ordering::Relaxed), 0);
    }
}
