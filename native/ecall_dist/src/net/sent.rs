//! What a connection's socket took, for the accounting of a link that ends.
//!
//! A request written to the socket has left ecall but not the machine: the
//! kernel holds its bytes until the peer's TCP acknowledges them. When a
//! link ends otherwise than by our own close (reaped as stalled, closed by
//! the peer, a read or write that failed), the bytes the kernel still holds
//! reach the peer only if the old connection gets them through before the
//! peer drops it (it drops it before it takes the link's next connection,
//! so they never arrive after newer requests). Nobody can tell which, so
//! the link counts the requests whose bytes were not acknowledged as
//! `unconfirmed`: possibly lost, an upper bound beside `dropped` (requests
//! that were never written, surely lost).
//!
//! The log keeps, for the writes of the last [`window`] bytes, where in the
//! connection's byte stream each ended and how many requests it completed;
//! the kernel says how many bytes at the end of the stream it still holds
//! ([`unacked`]). Bounded: at most [`MARKS`] marks per
//! connection; past that the two oldest are merged, which can only count
//! more (a merged mark is unconfirmed if its later part is).
//!
//! What the peer's kernel acknowledged but its node had not read when it
//! dropped the connection is lost too and counted nowhere: a healthy peer
//! reads its sockets within moments, so that is rare, but not impossible.

use std::collections::VecDeque;

/// Most marks kept per connection (16 bytes each).
pub(crate) const MARKS: usize = 4096;

/// One write that completed requests: where the stream stood after it.
#[derive(Debug, Clone, Copy)]
struct Mark {
    end: u64,
    requests: u64,
}

/// The log of one connection's socket (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct SentLog {
    /// Bytes the socket took since the connection was made.
    total: u64,
    marks: VecDeque<Mark>,
}

impl SentLog {
    /// The socket took `n` more bytes (a write, or part of one that failed).
    pub(crate) fn bytes(&mut self, n: u64) {
        self.total += n;
    }

    /// The bytes taken so far completed `requests` more requests.
    pub(crate) fn requests(&mut self, requests: u64) {
        if requests == 0 {
            return;
        }
        match self.marks.back_mut() {
            // Nothing written since: the same place in the stream.
            Some(m) if m.end == self.total => m.requests += requests,
            _ => self.marks.push_back(Mark {
                end: self.total,
                requests,
            }),
        }
        // A socket never holds more than its buffer: older marks are
        // acknowledged for certain.
        let floor = self.total.saturating_sub(window());
        while self.marks.front().is_some_and(|m| m.end <= floor) {
            self.marks.pop_front();
        }
        if self.marks.len() > MARKS {
            if let Some(oldest) = self.marks.pop_front() {
                if let Some(next) = self.marks.front_mut() {
                    next.requests += oldest.requests;
                }
            }
        }
    }

    /// Requests with a byte among the last `unacked` of the stream: those
    /// the peer may not have received.
    pub(crate) fn unconfirmed(&self, unacked: u64) -> u64 {
        let from = self.total.saturating_sub(unacked);
        self.marks
            .iter()
            .rev()
            .take_while(|m| m.end > from)
            .map(|m| m.requests)
            .sum()
    }
}

/// The most a socket's send buffer can hold here: twice the largest of the
/// kernel's limits (Linux doubles a buffer size for its bookkeeping), read
/// once; 64 MiB where they cannot be read.
pub(crate) fn window() -> u64 {
    static WINDOW: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *WINDOW.get_or_init(|| {
        let read = |path: &str| {
            std::fs::read_to_string(path).ok().and_then(|s| {
                s.split_whitespace()
                    .filter_map(|v| v.parse::<u64>().ok())
                    .max()
            })
        };
        match (
            read("/proc/sys/net/ipv4/tcp_wmem"),
            read("/proc/sys/net/core/wmem_max"),
        ) {
            (None, None) => 64 << 20,
            (a, b) => 2 * a.unwrap_or(0).max(b.unwrap_or(0)),
        }
    })
}

/// Bytes written to TCP socket `fd` that its peer has not acknowledged
/// (Linux's `SIOCOUTQ`), or `None` where the kernel does not say. The
/// caller must hold the socket open (a half of its
/// [`LinkStream`](crate::net::stream::LinkStream)).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_requests_of_the_unacknowledged_tail() {
        let mut log = SentLog::default();
        // Three writes of 100 bytes: 2, 3 and 5 requests; a tick between.
        log.bytes(100);
        log.requests(2);
        log.bytes(100);
        log.requests(3);
        log.bytes(4);
        log.bytes(100);
        log.requests(5);
        assert_eq!(log.unconfirmed(0), 0);
        // Part of the last write: its requests.
        assert_eq!(log.unconfirmed(1), 5);
        assert_eq!(log.unconfirmed(100), 5);
        // The tick and the last write: still only the last write's.
        assert_eq!(log.unconfirmed(104), 5);
        // One byte of the second write more.
        assert_eq!(log.unconfirmed(105), 8);
        assert_eq!(log.unconfirmed(304), 10);
        assert_eq!(log.unconfirmed(1 << 40), 10);
    }

    #[test]
    fn a_write_that_failed_in_part_moves_the_tail() {
        let mut log = SentLog::default();
        log.bytes(100);
        log.requests(1);
        // A write the socket took 40 bytes of before it failed: those
        // requests are counted as dropped, not here.
        log.bytes(40);
        assert_eq!(log.unconfirmed(40), 0);
        assert_eq!(log.unconfirmed(41), 1);
    }

    #[test]
    fn marks_are_bounded_and_merging_never_counts_less() {
        let mut log = SentLog::default();
        for _ in 0..3 * MARKS {
            log.bytes(10);
            log.requests(1);
        }
        assert!(log.marks.len() <= MARKS);
        // Every request is still counted once when everything is unacked.
        assert_eq!(log.unconfirmed(u64::MAX), 3 * MARKS as u64);
        // The newest marks stay exact.
        assert_eq!(log.unconfirmed(10), 1);
        assert_eq!(log.unconfirmed(100), 10);
    }

    #[test]
    fn marks_older_than_any_send_buffer_go() {
        let mut log = SentLog::default();
        log.bytes(10);
        log.requests(7);
        log.bytes(window() + 10);
        log.requests(1);
        assert_eq!(log.marks.len(), 1);
        assert_eq!(log.unconfirmed(u64::MAX), 1);
    }
}
