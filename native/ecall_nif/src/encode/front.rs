//! The request around a big message encoded on its own (`encode_large/1`,
//! then `push_encoded/4`): the NIF writes the request's front, up to the
//! message, and the encoding follows it, not encoded again.
//!
//! ```text
//! {send, Dest, Msg}                   104 3 <send: 119 4 "send"> <Dest> | <Msg>
//! {reply, Id, Reply}                  104 3 <reply: 119 5 "reply"> <Id> | <Reply>
//! {reply, Id, {external, <<Bytes>>}}  104 3 <reply> <Id> 104 2 <external: 119 8 "external">
//!                                       109 <len:32> | 131 <Reply>
//! Request (the encoding is all of it)                                   | <Request>
//!
//! <Dest>  the VM's term_to_binary of Dest, without its version byte
//! <Id>    97 <u8> | 98 <i32> | 110 <n:8> 0 <digits, little-endian>
//! |       where the front ends and the encoding follows: without its
//!         version byte, or with it as the bytes of the binary
//! ```
//!
//! The tags are [`SMALL_TUPLE_EXT`] (104), `SMALL_ATOM_UTF8_EXT` (119,
//! [`put_atom`]), [`BINARY_EXT`] (109) and [`VERSION`] (131); `<Id>` is
//! written as `term_to_binary` writes an integer ([`super::write::natural`]).
//! The whole is what `term_to_binary/1` gives for the request on OTP 26 and
//! later (on OTP 25 it writes `reply` and `external` as `ATOM_EXT`, the same
//! atoms), and what the peer's receiver replays: the external form's binary
//! goes to the caller, which decodes it there.
//!
//! Nothing here calls into the VM: tested on its own (see `pure_tests.rs`).

use super::write::natural;
use ecall_dist::wire::etf::{element_body, put_atom, BINARY_EXT, SMALL_TUPLE_EXT, VERSION};

/// The request an encoding goes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request<'d> {
    /// `{send, Dest, Msg}`: the encoding is `Msg`; `Dest` is given in
    /// external format without the version byte.
    Send(&'d [u8]),
    /// `{reply, Id, Reply}`: the encoding is `Reply`.
    Reply(u64),
    /// `{reply, Id, {external, Bytes}}`: the encoding, version byte
    /// included, is the binary `Bytes`.
    ReplyExternal(u64),
    /// The encoding is the whole request.
    Whole,
}

/// Appends the front of `request` to `out`, and returns what of
/// `encoded` (a whole `term_to_binary` result) follows it. `None` (and
/// `out` as it was) if `encoded` is not plain, uncompressed external
/// format, or is too long for a binary's length.
pub fn write<'e>(request: Request<'_>, encoded: &'e [u8], out: &mut Vec<u8>) -> Option<&'e [u8]> {
    let body = element_body(encoded)?;
    match request {
        Request::Whole => return Some(body),
        Request::Send(dest) => {
            out.extend_from_slice(&[SMALL_TUPLE_EXT, 3]);
            put_atom(out, "send");
            out.extend_from_slice(dest);
        }
        Request::Reply(id) => reply(id, out),
        Request::ReplyExternal(id) => {
            let len = u32::try_from(encoded.len()).ok()?;
            reply(id, out);
            out.extend_from_slice(&[SMALL_TUPLE_EXT, 2]);
            put_atom(out, "external");
            out.push(BINARY_EXT);
            out.extend_from_slice(&len.to_be_bytes());
            debug_assert_eq!(encoded.first(), Some(&VERSION));
            return Some(encoded);
        }
    }
    Some(body)
}

/// `{reply, Id, ` : the front both reply forms share.
fn reply(id: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(&[SMALL_TUPLE_EXT, 3]);
    put_atom(out, "reply");
    natural(id, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `term_to_binary(<<1,2,3>>)`: the message or reply encoded apart.
    const MSG: &[u8] = &[131, 109, 0, 0, 0, 3, 1, 2, 3];

    /// The front and what follows it, with a version byte in front: one
    /// whole external term, as the peer's receiver gets it.
    fn request(req: Request<'_>, encoded: &[u8]) -> Vec<u8> {
        let mut out = vec![VERSION];
        let rest = write(req, encoded, &mut out).expect("plain external format");
        out.extend_from_slice(rest);
        out
    }

    // Each expected term below is what `term_to_binary(T, [{minor_version,
    // 2}])` gives on OTP 25 (and `term_to_binary(T)` from OTP 26 on).

    #[test]
    fn a_send_is_the_request_around_the_message() {
        // term_to_binary(logger) without its version byte.
        let dest = [119, 6, b'l', b'o', b'g', b'g', b'e', b'r'];
        // {send, logger, <<1,2,3>>}
        let want = [
            131, 104, 3, 119, 4, 115, 101, 110, 100, 119, 6, 108, 111, 103, 103, 101, 114, 109, 0,
            0, 0, 3, 1, 2, 3,
        ];
        assert_eq!(request(Request::Send(&dest), MSG), want);
    }

    #[test]
    fn a_reply_carries_its_id_as_term_to_binary_writes_it() {
        // {reply, Id, [1,2]} for each Id: the id's bytes.
        let list = [131, 107, 0, 2, 1, 2];
        let cases: &[(u64, &[u8])] = &[
            (0, &[97, 0]),
            (255, &[97, 255]),
            (256, &[98, 0, 0, 1, 0]),
            ((1 << 31) - 1, &[98, 127, 255, 255, 255]),
            (1 << 31, &[110, 4, 0, 0, 0, 0, 128]),
            ((1 << 62) + 5, &[110, 8, 0, 5, 0, 0, 0, 0, 0, 0, 64]),
            (
                u64::MAX,
                &[110, 8, 0, 255, 255, 255, 255, 255, 255, 255, 255],
            ),
        ];
        for &(id, id_bytes) in cases {
            let mut want = vec![131, 104, 3, 119, 5, 114, 101, 112, 108, 121];
            want.extend_from_slice(id_bytes);
            want.extend_from_slice(&[107, 0, 2, 1, 2]);
            assert_eq!(request(Request::Reply(id), &list), want, "{id}");
        }
    }

    #[test]
    fn an_external_reply_holds_the_whole_encoding_in_a_binary() {
        // {reply, 300, {external, term_to_binary(<<1,2,3>>)}}
        let want = [
            131, 104, 3, 119, 5, 114, 101, 112, 108, 121, 98, 0, 0, 1, 44, 104, 2, 119, 8, 101,
            120, 116, 101, 114, 110, 97, 108, 109, 0, 0, 0, 9, 131, 109, 0, 0, 0, 3, 1, 2, 3,
        ];
        assert_eq!(request(Request::ReplyExternal(300), MSG), want);
    }

    #[test]
    fn a_whole_request_is_its_encoding() {
        assert_eq!(request(Request::Whole, MSG), MSG);
    }

    #[test]
    fn anything_but_plain_external_format_is_refused() {
        for enc in [&[][..], &[131], &[130, 97, 1], &[131, 80, 0, 0, 0, 3]] {
            for req in [
                Request::Whole,
                Request::Send(&[97, 1]),
                Request::Reply(1),
                Request::ReplyExternal(1),
            ] {
                let mut out = vec![7];
                assert_eq!(write(req, enc, &mut out), None, "{req:?} {enc:?}");
                assert_eq!(out, [7], "nothing written");
            }
        }
    }
}
