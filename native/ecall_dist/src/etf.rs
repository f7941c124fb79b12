//! The few pieces of the external term format the link writes by hand.
//!
//! Payloads are never decoded or re-encoded here: the caller encodes each
//! request once (`term_to_binary`), and a batch frame is spliced from those
//! element bytes behind a fixed header. Only the constant parts of a frame
//! (control tuple, `{batch, [...]}` head, list tail) are written by this
//! module.

/// `VERSION_MAGIC` that starts every external term.
pub const VERSION: u8 = 131;
/// Pass-through byte that starts every distribution message (no atom cache).
pub const PASS_THROUGH: u8 = 112;
const SMALL_INTEGER_EXT: u8 = 97;
const SMALL_TUPLE_EXT: u8 = 104;
const LIST_EXT: u8 = 108;
/// `NIL_EXT`, the tail of a proper list.
pub const NIL_EXT: u8 = 106;
const SMALL_ATOM_UTF8_EXT: u8 = 119;
const ATOM_UTF8_EXT: u8 = 118;
const NEW_PID_EXT: u8 = 88;

/// Distribution control message tag of `REG_SEND`.
pub const REG_SEND: u8 = 6;
/// Distribution control message tag of `SEND`.
pub const SEND: u8 = 2;

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

/// Appends a pid of `node` (`NEW_PID_EXT`).
pub fn put_pid(out: &mut Vec<u8>, node: &str, id: u32, serial: u32, creation: u32) {
    out.push(NEW_PID_EXT);
    put_atom(out, node);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&serial.to_be_bytes());
    out.extend_from_slice(&creation.to_be_bytes());
}

/// The fixed front of every batch frame sent from one C-node to one
/// registered receiver, up to and including the list length field.
///
/// Layout: `<len:32> 112 <131 {6, From, '', To}> <131 {batch, [` `<count:32>`.
/// The length and the count are placeholders that [`BatchHeader::seal`]
/// fills in once the batch is complete.
#[derive(Debug, Clone)]
pub struct BatchHeader {
    bytes: Vec<u8>,
}

impl BatchHeader {
    /// Header for batches from `from_node`'s pid `<0.1.0>` to the process
    /// registered as `to_name` on the peer.
    pub fn new(from_node: &str, creation: u32, to_name: &str) -> Self {
        let mut b = Vec::with_capacity(64 + from_node.len() + to_name.len());
        b.extend_from_slice(&[0, 0, 0, 0, PASS_THROUGH, VERSION, SMALL_TUPLE_EXT, 4]);
        b.extend_from_slice(&[SMALL_INTEGER_EXT, REG_SEND]);
        put_pid(&mut b, from_node, 1, 0, creation);
        put_atom(&mut b, "");
        put_atom(&mut b, to_name);
        b.extend_from_slice(&[VERSION, SMALL_TUPLE_EXT, 2]);
        put_atom(&mut b, "batch");
        b.extend_from_slice(&[LIST_EXT, 0, 0, 0, 0]);
        BatchHeader { bytes: b }
    }

    /// The header bytes, with zero placeholders.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Completes a frame that starts with this header and continues with
    /// `count` elements: writes the length and the count and appends the
    /// list tail.
    pub fn seal(frame: &mut Vec<u8>, header_len: usize, count: u32) {
        frame[header_len - 4..header_len].copy_from_slice(&count.to_be_bytes());
        frame.push(NIL_EXT);
        let len = (frame.len() - 4) as u32;
        frame[0..4].copy_from_slice(&len.to_be_bytes());
    }
}

/// Strips the version byte of one `term_to_binary` result so that it can be
/// spliced into a list. Returns `None` for anything that is not plain
/// (uncompressed) external format.
pub fn element_body(etf: &[u8]) -> Option<&[u8]> {
    match etf {
        // 80 is COMPRESSED: it may only stand at the top of a term.
        [VERSION, tag, ..] if *tag != 80 => Some(&etf[1..]),
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

    #[test]
    fn compressed_elements_are_refused() {
        assert_eq!(element_body(&[131, 80, 0, 0]), None);
        assert_eq!(element_body(&[130, 97, 1]), None);
        assert_eq!(element_body(&[131, 97, 1]), Some(&[97u8, 1][..]));
    }
}
