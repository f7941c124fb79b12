//! Large messages in fragments (`DFLAG_FRAGMENTS`).
//!
//! A single message larger than [`FRAGMENT`] goes out in pieces of that
//! size, one per writer pass, so that other shards' batches are written
//! between them instead of waiting behind it. Fragments are sent straight
//! from the message's batch buffer (no copy): fragment headers are written
//! in front of slices of it.

use crate::wire::conn_atom_cache::OutCache;
use crate::wire::etf::{self, FRAG_HEADER, FRAME_LEN, PLAIN_TERMS};
use crate::wire::frame::Frame;
use crate::wire::term_walk;
use std::ops::Range;

/// A single message larger than this goes out in fragments of this size,
/// so that other shards' batches are written between them instead of
/// waiting behind it.
pub const FRAGMENT: usize = 64 * 1024;

/// A large message going out one fragment per writer pass. Its terms are
/// sent as they are: atoms as text, or id references ([`crate::wire::fixed_atom_ids`])
/// that its first fragment's header declares.
pub(crate) struct InFlight {
    /// The shard it came from (whose next batches wait: per-caller order).
    pub(crate) shard: usize,
    /// The batch that holds it.
    pub(crate) frame: Frame,
    seq: u64,
    /// The message's terms without their version bytes: two ranges of
    /// `frame.bytes` (control, payload).
    ranges: [Range<usize>; 2],
    /// Term bytes already sent.
    sent: usize,
    /// Fragments still to send, this one included.
    pub(crate) left: u64,
}

impl InFlight {
    /// The terms of a plain frame (`<len:32> 112 131 control 131 payload`)
    /// without their version bytes, or `None` if it is not one.
    pub(crate) fn ranges(bytes: &[u8]) -> Option<[Range<usize>; 2]> {
        if bytes.get(FRAME_LEN..PLAIN_TERMS + 1)? != [etf::PASS_THROUGH, etf::VERSION] {
            return None;
        }
        let control = PLAIN_TERMS + 1;
        let control_end = term_walk::own_term_end(bytes, control)?;
        if bytes.get(control_end) != Some(&etf::VERSION) {
            return None;
        }
        Some([control..control_end, control_end + 1..bytes.len()])
    }

    /// Message `seq` of `shard`, whose terms are `ranges` of `frame`.
    pub(crate) fn new(shard: usize, frame: Frame, seq: u64, ranges: [Range<usize>; 2]) -> InFlight {
        let total = ranges[0].len() + ranges[1].len();
        InFlight {
            shard,
            frame,
            seq,
            ranges,
            sent: 0,
            left: total.div_ceil(FRAGMENT) as u64,
        }
    }

    /// Appends the next fragment's header to `headers` and returns the byte
    /// ranges of its data. The first fragment's header lists the ids given
    /// so far, through the connection's `cache`.
    pub(crate) fn next(
        &mut self,
        headers: &mut Vec<Vec<u8>>,
        cache: &mut OutCache,
    ) -> Vec<Range<usize>> {
        let total = self.ranges[0].len() + self.ranges[1].len();
        let len = FRAGMENT.min(total - self.sent);
        let first = self.sent == 0;
        // See the fragment diagram in `etf`. The first fragment's header
        // declares the atom cache references (the ids), the others none.
        let mut h = Vec::with_capacity(FRAME_LEN + FRAG_HEADER + 1);
        h.extend_from_slice(&[0; FRAME_LEN]);
        let kind = if first {
            etf::DIST_FRAG_HEADER
        } else {
            etf::DIST_FRAG_CONT
        };
        h.extend_from_slice(&[etf::VERSION, kind]);
        h.extend_from_slice(&self.seq.to_be_bytes());
        h.extend_from_slice(&self.left.to_be_bytes());
        if first {
            cache.fragment_refs(&mut h);
        }
        let frame_len = (h.len() - FRAME_LEN + len) as u32;
        h[..FRAME_LEN].copy_from_slice(&frame_len.to_be_bytes());
        headers.push(h);
        let mut data = Vec::with_capacity(2);
        let (mut from, mut want) = (self.sent, len);
        for r in &self.ranges {
            if from >= r.len() {
                from -= r.len();
                continue;
            }
            let take = want.min(r.len() - from);
            data.push(r.start + from..r.start + from + take);
            want -= take;
            from = 0;
            if want == 0 {
                break;
            }
        }
        self.sent += len;
        self.left -= 1;
        data
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::etf::BatchHeader;
    use crate::wire::frame::Frame;

    #[test]
    fn fragments_cover_the_terms_and_count_down() {
        let header = BatchHeader::new("a_ecall_1@h", 1, "ecall_rx_1", 1, 0);
        let big = vec![7u8; 3 * FRAGMENT + 5];
        // A batch of one binary, as a shard builds it.
        let mut bytes = header.as_bytes().to_vec();
        bytes.push(etf::BINARY_EXT);
        bytes.extend_from_slice(&(big.len() as u32).to_be_bytes());
        bytes.extend_from_slice(&big);
        BatchHeader::seal(&mut bytes, header.as_bytes().len(), 1, 1);
        let payload = bytes.len() - header.as_bytes().len();
        let frame = Frame::alone(bytes, payload, 1);
        let ranges = InFlight::ranges(&frame.bytes).unwrap();
        let expect: Vec<u8> = ranges
            .iter()
            .flat_map(|r| frame.bytes[r.clone()].to_vec())
            .collect();
        let mut f = InFlight::new(0, frame, 9, ranges);
        assert_eq!(f.left, 4);
        let mut cache = OutCache::default();
        let (mut headers, mut got) = (Vec::new(), Vec::new());
        while f.left > 0 {
            let left = f.left;
            let data = f.next(&mut headers, &mut cache);
            let h = headers.last().unwrap();
            let len: usize = data.iter().map(|r| r.len()).sum();
            let (len_field, rest) = h.split_at(FRAME_LEN);
            assert_eq!(
                u32::from_be_bytes(len_field.try_into().unwrap()) as usize,
                rest.len() + len
            );
            let kind = if left == 4 {
                etf::DIST_FRAG_HEADER
            } else {
                etf::DIST_FRAG_CONT
            };
            assert_eq!(rest[..2], [etf::VERSION, kind]);
            assert_eq!(u64::from_be_bytes(rest[2..10].try_into().unwrap()), 9);
            assert_eq!(u64::from_be_bytes(rest[10..18].try_into().unwrap()), left);
            if left == 4 {
                // The ids given so far, declared: count, flags, refs.
                let ids = usize::from(rest[FRAG_HEADER]);
                assert!(rest.len() > FRAG_HEADER + ids, "{rest:?}");
            } else {
                assert_eq!(rest.len(), FRAG_HEADER);
            }
            for r in data {
                got.extend_from_slice(&f.frame.bytes[r]);
            }
        }
        assert_eq!(got, expect);
        assert!(InFlight::ranges(&[0, 0, 0, 1, etf::VERSION]).is_none());
    }
}
