//! The few pieces of the external term format the link writes by hand.
//!
//! Payloads are never decoded or re-encoded here: the caller encodes each
//! request once (`term_to_binary`), and a batch frame is spliced from those
//! element bytes behind a fixed header. Only the constant parts of a frame
//! (control tuple, `{batch, [...]}` head, list tail) are written by this
//! module.
//!
//! # Frames
//!
//! Every frame on a connection starts with its length ([`FRAME_LEN`] bytes,
//! big-endian, not counting itself); a frame of length 0 is a tick. A batch
//! frame, as a shard builds it ([`BatchHeader`]), is a plain distribution
//! message: the pass-through byte, then two whole external terms, each with
//! its version byte.
//!
//! ```text
//! 0          4     5 = PLAIN_TERMS
//! +----------+-----+-------------------------+-------------------------------------------------------+
//! |  len:32  | 112 | 131 {6, From, '', To}   | 131 {batch, Node, Stream, [<count:32> elements... 106]} |
//! +----------+-----+-------------------------+-------------------------------------------------------+
//!            |<--------------------------------------- len ---------------------------------------->|
//!
//! control  = 131 104 4  97 6  <From: 88 pid>  <'': 119 0>  <To: 119 n name>
//! payload  = 131 104 4  <batch: 119 5 "batch">  <Node: 119 n name>
//!            109 <20:32> <epoch:64> <shard:32> <seq:64>      (Stream, a binary)
//!            108 <count:32>  element ... 106
//! element  = one caller's term_to_binary output without its version byte
//! ```
//!
//! The tags are [`PASS_THROUGH`] (112), [`VERSION`] (131),
//! [`SMALL_TUPLE_EXT`] (104), [`SMALL_INTEGER_EXT`] (97), [`REG_SEND`] (6),
//! [`NEW_PID_EXT`] (88), [`SMALL_ATOM_UTF8_EXT`] (119), [`BINARY_EXT`]
//! (109), [`LIST_EXT`] (108) and [`NIL_EXT`] (106). `Node` is the sending
//! C-node's name (where the receiver sends its acknowledgements),
//! `Stream` numbers the batch: the peer's epoch (one per opening of the
//! peer), the shard, and the batch's number in that shard, from 1. The
//! length, the number and the count are written when the batch is sealed
//! ([`BatchHeader::seal`]).
//!
//! # The distribution-header form
//!
//! On a connection that negotiated the atom cache, the writer rewrites each
//! plain frame ([`crate::wire::conn_atom_cache`]): the pass-through byte and the
//! version bytes go, a distribution header declares the atom cache
//! references, and atoms in the terms become two-byte references.
//!
//! ```text
//! 0          4     5    6     7
//! +----------+-----+----+-----+----------------+-----------+---------+---------+
//! |  len:32  | 131 | 68 | N:8 | flags          | refs      | control | payload |
//! +----------+-----+----+-----+----------------+-----------+---------+---------+
//!                              N/2+1 bytes:     N entries:  terms without version
//!                              a nibble per     index, and  bytes; an atom may be
//!                              ref, one for     length and  82 <i> (the ith ref)
//!                              long atoms       text if new
//! (N = 0: no flags, no refs)
//! ```
//!
//! A single large message may instead go in fragments ([`crate::wire::fragment`]),
//! the first with a header of its own ([`DIST_FRAG_HEADER`]), the others
//! with [`DIST_FRAG_CONT`]; `frag id` counts down to 1:
//!
//! ```text
//! +----------+-----+----+---------+------------+-----+-------+------+------------------+
//! |  len:32  | 131 | 69 | seq:64  | frag id:64 | N:8 | flags | refs | control payload… |
//! +----------+-----+----+---------+------------+-----+-------+------+------------------+
//! +----------+-----+----+---------+------------+-------------------+
//! |  len:32  | 131 | 70 | seq:64  | frag id:64 | …payload          |
//! +----------+-----+----+---------+------------+-------------------+
//! ```

// ---- Frame and header bytes -------------------------------------------

/// Bytes of the length that starts every frame (big-endian, not counting
/// itself; 0 is a tick).
pub const FRAME_LEN: usize = 4;
/// Where the terms of a plain frame start: after the length and
/// [`PASS_THROUGH`], at the control term's version byte.
pub const PLAIN_TERMS: usize = FRAME_LEN + 1;
/// Bytes of a fragment header after the frame length, up to its atom cache
/// part: `131 69|70 <seq:64> <frag id:64>`.
pub const FRAG_HEADER: usize = 2 + 8 + 8;
/// `VERSION_MAGIC` that starts every external term.
pub const VERSION: u8 = 131;
/// Pass-through byte that starts a distribution message without a header.
pub const PASS_THROUGH: u8 = 112;
/// `131 68`: a normal distribution header (atom cache references).
pub const DIST_HEADER: u8 = 68;
/// `131 69`: the header of the first fragment of a fragmented message.
pub const DIST_FRAG_HEADER: u8 = 69;
/// `131 70`: the header of a later fragment.
pub const DIST_FRAG_CONT: u8 = 70;
/// A reference to the `i`th entry declared by the distribution header.
pub const ATOM_CACHE_REF: u8 = 82;
/// Compressed term (`term_to_binary(T, [compressed])`): only at the top of
/// a term, never inside a spliced list.
pub const COMPRESSED: u8 = 80;

// ---- Term tags ----------------------------------------------------------

/// `NEW_FLOAT_EXT`: 8-byte IEEE float.
pub const NEW_FLOAT_EXT: u8 = 70;
/// `BIT_BINARY_EXT`: length, bits in the last byte, data.
pub const BIT_BINARY_EXT: u8 = 77;
/// `NEW_PID_EXT`: node atom, id, serial, creation (32 bits each).
pub const NEW_PID_EXT: u8 = 88;
/// `NEW_PORT_EXT`: node atom, id, creation.
pub const NEW_PORT_EXT: u8 = 89;
/// `NEWER_REFERENCE_EXT`: id count, node atom, creation, ids.
pub const NEWER_REFERENCE_EXT: u8 = 90;
/// `SMALL_INTEGER_EXT`: one unsigned byte.
pub const SMALL_INTEGER_EXT: u8 = 97;
/// `INTEGER_EXT`: four bytes, signed.
pub const INTEGER_EXT: u8 = 98;
/// `FLOAT_EXT`: 31 bytes of text (old).
pub const FLOAT_EXT: u8 = 99;
/// `ATOM_EXT`: Latin-1 text, 16-bit length (deprecated).
pub const ATOM_EXT: u8 = 100;
/// `REFERENCE_EXT` (old): node atom, id, creation.
pub const REFERENCE_EXT: u8 = 101;
/// `PORT_EXT` (old): node atom, id, creation.
pub const PORT_EXT: u8 = 102;
/// `PID_EXT` (old): node atom, id, serial, creation (one byte).
pub const PID_EXT: u8 = 103;
/// `SMALL_TUPLE_EXT`: one-byte arity, then the elements.
pub const SMALL_TUPLE_EXT: u8 = 104;
/// `LARGE_TUPLE_EXT`: four-byte arity, then the elements.
pub const LARGE_TUPLE_EXT: u8 = 105;
/// `NIL_EXT`: the empty list, the tail of a proper list.
pub const NIL_EXT: u8 = 106;
/// `STRING_EXT`: a list of bytes, 16-bit length.
pub const STRING_EXT: u8 = 107;
/// `LIST_EXT`: four-byte length, the elements, then the tail.
pub const LIST_EXT: u8 = 108;
/// `BINARY_EXT`: four-byte length, data.
pub const BINARY_EXT: u8 = 109;
/// `SMALL_BIG_EXT`: one-byte digit count, sign, digits.
pub const SMALL_BIG_EXT: u8 = 110;
/// `LARGE_BIG_EXT`: four-byte digit count, sign, digits.
pub const LARGE_BIG_EXT: u8 = 111;
/// `NEW_FUN_EXT`: four-byte total size covers the whole fun.
pub const NEW_FUN_EXT: u8 = 112;
/// `EXPORT_EXT`: module, function, arity as three terms.
pub const EXPORT_EXT: u8 = 113;
/// `NEW_REFERENCE_EXT`: id count, node atom, creation (one byte), ids.
pub const NEW_REFERENCE_EXT: u8 = 114;
/// `SMALL_ATOM_EXT`: Latin-1 text, 8-bit length (deprecated).
pub const SMALL_ATOM_EXT: u8 = 115;
/// `MAP_EXT`: four-byte pair count, then keys and values.
pub const MAP_EXT: u8 = 116;
/// `ATOM_UTF8_EXT`: UTF-8 text, 16-bit length.
pub const ATOM_UTF8_EXT: u8 = 118;
/// `SMALL_ATOM_UTF8_EXT`: UTF-8 text, 8-bit length.
pub const SMALL_ATOM_UTF8_EXT: u8 = 119;
/// `V4_PORT_EXT`: node atom, 64-bit id, creation.
pub const V4_PORT_EXT: u8 = 120;

// ---- Distribution control messages --------------------------------------

/// Control tag of `SEND`: `{2, Unused, ToPid}`.
pub const SEND: u8 = 2;
/// Control tag of `REG_SEND`: `{6, FromPid, Unused, ToName}`.
pub const REG_SEND: u8 = 6;
/// Control tag of `ALIAS_SEND`: `{33, FromPid, Alias}`.
pub const ALIAS_SEND: u8 = 33;

/// Appends an atom (UTF-8 encoding, the only one OTP 26+ accepts).
pub fn put_atom(out: &mut Vec<u8>, name: &str) {
    let bytes = name.as_bytes();
    if bytes.len() < 256 {
        out.push(SMALL_ATOM_UTF8_EXT);
        out.push(bytes.len() as u8);
    } else {
        out.push(ATOM_UTF8_EXT);
        out.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
    }
    out.extend_from_slice(bytes);
}

/// Bytes of a batch's `Stream` binary: epoch, shard, number.
pub const STREAM_LEN: usize = 8 + 4 + 8;

/// Where a batch's number sits before the end of its header: after it come
/// the list's tag and its count.
const SEQ_FROM_END: usize = 8 + 1 + 4;

/// The fixed front of every batch frame sent from one C-node to one
/// registered receiver, up to and including the list length field.
///
/// Layout: `<len:32> 112 <131 {6, From, '', To}> <131 {batch, Node,
/// Stream, [` `<count:32>`. The length, the batch's number (in `Stream`)
/// and the count are placeholders that [`BatchHeader::seal`] fills in once
/// the batch is complete. Its atoms are id references
/// ([`crate::wire::fixed_atom_ids`]) when they have ids, else text.
#[derive(Debug, Clone)]
pub struct BatchHeader {
    bytes: Vec<u8>,
    text: bool,
    /// Where the `From` pid starts and ends in `bytes` (for
    /// [`BatchHeader::direct`]).
    from: std::ops::Range<usize>,
}

impl BatchHeader {
    /// Header for batches from `from_node`'s pid `<0.1.0>` to the process
    /// registered as `to_name` on the peer, numbered in stream `shard` of
    /// epoch `epoch`.
    pub fn new(from_node: &str, creation: u32, to_name: &str, epoch: u64, shard: u32) -> Self {
        let mut b = Vec::with_capacity(64 + from_node.len() + to_name.len());
        let mut text = false;
        let mut atom =
            |b: &mut Vec<u8>, name: &str| match crate::wire::fixed_atom_ids::id_of(name.as_bytes())
            {
                Some(id) => b.extend_from_slice(&[ATOM_CACHE_REF, id]),
                None => {
                    text = true;
                    put_atom(b, name);
                }
            };
        b.extend_from_slice(&[0, 0, 0, 0, PASS_THROUGH, VERSION, SMALL_TUPLE_EXT, 4]);
        b.extend_from_slice(&[SMALL_INTEGER_EXT, REG_SEND]);
        let from_start = b.len();
        b.push(NEW_PID_EXT);
        atom(&mut b, from_node);
        b.extend_from_slice(&1u32.to_be_bytes());
        b.extend_from_slice(&0u32.to_be_bytes());
        b.extend_from_slice(&creation.to_be_bytes());
        let from = from_start..b.len();
        atom(&mut b, "");
        atom(&mut b, to_name);
        b.extend_from_slice(&[VERSION, SMALL_TUPLE_EXT, 4]);
        atom(&mut b, "batch");
        atom(&mut b, from_node);
        b.push(BINARY_EXT);
        b.extend_from_slice(&(STREAM_LEN as u32).to_be_bytes());
        b.extend_from_slice(&epoch.to_be_bytes());
        b.extend_from_slice(&shard.to_be_bytes());
        b.extend_from_slice(&0u64.to_be_bytes());
        b.extend_from_slice(&[LIST_EXT, 0, 0, 0, 0]);
        BatchHeader {
            bytes: b,
            text,
            from,
        }
    }

    /// The front of a frame that carries one message straight to `to` on
    /// the peer, instead of to the receiver: `<len:32> 112 <131 control>`,
    /// the message (with its own version byte) to follow, the length a
    /// placeholder that [`BatchHeader::seal_direct`] fills in.
    ///
    /// `to` is a pid, an atom or an alias (a reference) in external format
    /// without the version byte (as the NIF gets it from
    /// `term_to_binary/1`): `SEND` `{2, '', Pid}` to a pid, `REG_SEND` `{6,
    /// From, '', Name}` to a registered name, `ALIAS_SEND` `{33, From,
    /// Alias}` to an alias (the links offer `DFLAG_ALIAS`), from the same
    /// pid as the batches. `None` for anything else.
    ///
    /// ```text
    ///  <len:32> 112 131 104 3 97 2 <''> <pid>               SEND
    ///  <len:32> 112 131 104 4 97 6 <From> <''> <name>       REG_SEND
    ///  <len:32> 112 131 104 3 97 33 <From> <ref>            ALIAS_SEND
    /// ```
    ///
    /// The receiving node decodes such a message in the receiving
    /// process, as it does a message sent with `!`: no relay builds it
    /// first and copies it again.
    pub fn direct(&self, to: &[u8]) -> Option<Vec<u8>> {
        let mut b = Vec::with_capacity(32 + self.from.len() + to.len());
        b.extend_from_slice(&[0, 0, 0, 0, PASS_THROUGH, VERSION, SMALL_TUPLE_EXT]);
        match direct_control(to)? {
            SEND => {
                b.extend_from_slice(&[3, SMALL_INTEGER_EXT, SEND]);
                put_atom(&mut b, "");
            }
            REG_SEND => {
                b.extend_from_slice(&[4, SMALL_INTEGER_EXT, REG_SEND]);
                b.extend_from_slice(&self.bytes[self.from.clone()]);
                put_atom(&mut b, "");
            }
            tag => {
                b.extend_from_slice(&[3, SMALL_INTEGER_EXT, tag]);
                b.extend_from_slice(&self.bytes[self.from.clone()]);
            }
        }
        b.extend_from_slice(to);
        Some(b)
    }

    /// Completes a direct frame (see [`BatchHeader::direct`]): writes its
    /// length.
    pub fn seal_direct(frame: &mut [u8]) {
        let len = (frame.len() - 4) as u32;
        frame[0..4].copy_from_slice(&len.to_be_bytes());
    }

    /// Whether some of its atoms are text (the ids ran out).
    pub fn has_text(&self) -> bool {
        self.text
    }

    /// The header bytes, with zero placeholders.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Writes batch number `seq` into a sealed frame of this header (one
    /// built before its number was known).
    pub fn set_seq(frame: &mut [u8], header_len: usize, seq: u64) {
        let at = header_len - SEQ_FROM_END;
        frame[at..at + 8].copy_from_slice(&seq.to_be_bytes());
    }

    /// Completes a frame that starts with this header and continues with
    /// `count` elements, batch number `seq` of its stream: writes the
    /// length, the number and the count and appends the list tail.
    pub fn seal(frame: &mut Vec<u8>, header_len: usize, count: u32, seq: u64) {
        BatchHeader::set_seq(frame, header_len, seq);
        frame[header_len - 4..header_len].copy_from_slice(&count.to_be_bytes());
        frame.push(NIL_EXT);
        let len = (frame.len() - 4) as u32;
        frame[0..4].copy_from_slice(&len.to_be_bytes());
    }
}

/// The control message that carries a message straight to `to` (external
/// format without the version byte, see [`BatchHeader::direct`]): `SEND`
/// to a pid, `REG_SEND` to a registered name, `ALIAS_SEND` to an alias;
/// `None` for anything else.
pub fn direct_control(to: &[u8]) -> Option<u8> {
    match *to.first()? {
        NEW_PID_EXT | PID_EXT => Some(SEND),
        ATOM_EXT | SMALL_ATOM_EXT | ATOM_UTF8_EXT | SMALL_ATOM_UTF8_EXT => Some(REG_SEND),
        NEWER_REFERENCE_EXT | NEW_REFERENCE_EXT => Some(ALIAS_SEND),
        _ => None,
    }
}

/// Strips the version byte of one `term_to_binary` result so that it can be
/// spliced into a list. Returns `None` for anything that is not plain
/// (uncompressed) external format.
pub fn element_body(etf: &[u8]) -> Option<&[u8]> {
    match etf {
        [VERSION, tag, ..] if *tag != COMPRESSED => Some(&etf[1..]),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atoms_use_utf8_tags() {
        let mut v = Vec::new();
        put_atom(&mut v, "batch");
        assert_eq!(v, [119, 5, b'b', b'a', b't', b'c', b'h']);
        let long = "x".repeat(300);
        let mut v = Vec::new();
        put_atom(&mut v, &long);
        assert_eq!(&v[..3], &[118, 1, 44]);
    }

    /// A sealed batch carries `<<Epoch:64, Shard:32, Seq:64>>` as a
    /// binary right before its list, whose count follows (how a real node
    /// decodes it: `real_erl.rs`).
    #[test]
    fn a_sealed_batch_carries_its_stream_and_number() {
        let h = BatchHeader::new("a_ecall_1@h", 1, "ecall_rx_1", 0x0102_0304_0506_0708, 9);
        let mut f = h.as_bytes().to_vec();
        f.extend_from_slice(&[SMALL_INTEGER_EXT, 5]);
        BatchHeader::seal(&mut f, h.as_bytes().len(), 1, 77);
        assert_eq!(
            u32::from_be_bytes(f[..4].try_into().unwrap()) as usize,
            f.len() - 4
        );
        let mut tail = vec![BINARY_EXT, 0, 0, 0, STREAM_LEN as u8];
        tail.extend_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
        tail.extend_from_slice(&9u32.to_be_bytes());
        tail.extend_from_slice(&77u64.to_be_bytes());
        tail.extend_from_slice(&[LIST_EXT, 0, 0, 0, 1, SMALL_INTEGER_EXT, 5, NIL_EXT]);
        assert!(f.ends_with(&tail), "{f:?}");
    }

    #[test]
    fn compressed_elements_are_refused() {
        assert_eq!(element_body(&[131, 80, 0, 0]), None);
        assert_eq!(element_body(&[130, 97, 1]), None);
        assert_eq!(element_body(&[131, 97, 1]), Some(&[97u8, 1][..]));
    }
}
