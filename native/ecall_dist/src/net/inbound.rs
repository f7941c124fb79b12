//! What a peer sends us: reading frames, checking them, and answering the
//! one message a C-node must answer.
//!
//! A connected peer sends ticks (empty frames), the acknowledgements of its
//! receivers (`ecall_ack`, handed to the link: `queue/shard.rs`) and,
//! rarely, other messages to our node name. The only one we answer is
//! net_kernel's `is_auth` call, which is what `net_adm:ping/1` sends.
//! Everything else that is well formed is read, counted and ignored, so
//! that the peer's writes never block on a full socket buffer.
//!
//! Everything here is hostile input. The rules, each with its reason:
//!
//! * No length read off the wire sizes an allocation beyond a fixed bound: a
//!   frame longer than [`MAX_INCOMING_FRAME`] closes the connection before a
//!   byte of it is buffered, and expanding atom cache references stops at
//!   [`MAX_DECODED`] (a two-byte reference may stand for 65,535 bytes).
//! * No nesting read off the wire sizes a recursion: terms are never built.
//!   The walker in [`crate::wire::term_walk`] is iterative (a count of terms still
//!   to walk, not a stack), and the `is_auth` shape is matched at fixed
//!   positions, skipping the parts we copy back by where they end.
//! * A frame that is not well formed closes its connection (the caller logs
//!   it and counts it); the node and every other connection go on.
//!
//! ```text
//! frame        = <len:32> body               len 0 is a tick
//! body (plain) = 112 <131 Control> [<131 Payload>]
//! body (cache) = 131 68 <N> <flags> <refs> <Control> [<Payload>]
//! first frag.  = 131 69 <seq:64> <frag id:64> <N> <flags> <refs> ...
//! next frag.   = 131 70 <seq:64> <frag id:64> ...
//! is_auth      = Control {6, From, '', net_kernel}   (REG_SEND)
//!                Payload {'$gen_call', {Pid, Tag}, {is_auth, Node}}
//! answer       = Control {2, '', Pid}                (SEND)
//!                Payload {Tag, yes}
//! ack          = Control {6, From, '', ecall_ack}    (REG_SEND)
//!                Payload <<Epoch:64, Shard:32, Seq:64>>
//! ```
//!
//! An acknowledgement is checked by the link it came on: a shard that is
//! not the link's, or a number it never sent, closes the connection.

use crate::wire::conn_atom_cache::{Decoded, InCache};
use crate::wire::etf;
use crate::wire::term_walk;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Largest incoming frame we read. Ticks and control messages are tiny;
/// a peer that negotiated fragments sends large messages in pieces of about
/// 64 KiB. A larger frame is refused before it is buffered.
pub const MAX_INCOMING_FRAME: usize = 1 << 20;

/// Largest body that expanding atom cache references may produce.
pub const MAX_DECODED: usize = 2 << 20;

/// The empty frame that keeps a connection alive.
pub const TICK: [u8; 4] = [0, 0, 0, 0];

/// Why an incoming frame closed its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    /// Longer than [`MAX_INCOMING_FRAME`].
    TooLarge,
    /// Starts with neither the pass-through byte nor a distribution header.
    UnknownKind,
    /// A distribution header that does not parse, a reference to an entry
    /// it did not declare, or an expansion past [`MAX_DECODED`].
    BadHeader,
    /// Terms that do not parse, or bytes after them.
    BadTerm,
    /// An acknowledgement of a shard or a number the link never sent.
    BadAck,
}

impl Malformed {
    /// A short name, for logs and for the reason a link reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Malformed::TooLarge => "frame_too_large",
            Malformed::UnknownKind => "unknown_frame_kind",
            Malformed::BadHeader => "bad_distribution_header",
            Malformed::BadTerm => "bad_term",
            Malformed::BadAck => "bad_ack",
        }
    }
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to do with one incoming frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Send this frame back (a plain pass-through frame, length included).
    Answer(Vec<u8>),
    /// A receiver's acknowledgement: batches up to number `seq` of stream
    /// `shard` in epoch `epoch` were processed.
    Ack {
        /// The epoch of the peer's opening.
        epoch: u64,
        /// The shard.
        shard: u32,
        /// The last number processed.
        seq: u64,
    },
    /// Well formed, nothing to answer.
    Ignore,
    /// Close the connection.
    Close(Malformed),
}

/// Counters of one connection's (or one identity's) incoming frames.
#[derive(Debug, Default)]
pub struct InboundStats {
    /// Non-empty frames read.
    pub frames: AtomicU64,
    /// `is_auth` calls answered.
    pub answered: AtomicU64,
    /// Well-formed frames with nothing to answer.
    pub ignored: AtomicU64,
    /// Connections closed on a malformed frame.
    pub malformed: AtomicU64,
}

/// Reads one frame into `buf`. Returns `Ok(false)` for a tick. A frame over
/// [`MAX_INCOMING_FRAME`] is an `InvalidData` error: nothing of it is read.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> io::Result<bool> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await?;
    let len = u32::from_be_bytes(len) as usize;
    if len == 0 {
        return Ok(false);
    }
    if len > MAX_INCOMING_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            Malformed::TooLarge.as_str(),
        ));
    }
    buf.clear();
    buf.resize(len, 0);
    r.read_exact(buf).await?;
    Ok(true)
}

/// The receiving half of a connection: keeps the connection's atom cache
/// current and decides what each frame calls for.
#[derive(Debug, Default)]
pub struct Inbound {
    /// Made on the first frame that has a header: connections that never
    /// use the cache (accepted pings) do not pay for its 2,048 slots.
    cache: Option<InCache>,
}

impl Inbound {
    /// Checks one incoming frame (without its length) and says what to do.
    /// Frames with a distribution header are decoded first, always, since
    /// later frames may refer to the cache entries they create.
    pub fn handle(&mut self, frame: &[u8]) -> Verdict {
        let decoded;
        let body = match frame {
            [etf::PASS_THROUGH, body @ ..] => {
                if !well_formed(body) {
                    return Verdict::Close(Malformed::BadTerm);
                }
                body
            }
            [etf::VERSION, etf::DIST_HEADER | etf::DIST_FRAG_HEADER, ..] => {
                let cache = self.cache.get_or_insert_with(InCache::default);
                match cache.decode(frame, MAX_DECODED) {
                    Some(Decoded::Body(b)) => {
                        decoded = b;
                        &decoded[..]
                    }
                    Some(Decoded::Fragment) => return Verdict::Ignore,
                    None => return Verdict::Close(Malformed::BadHeader),
                }
            }
            // A later fragment of a message we do not reassemble.
            [etf::VERSION, etf::DIST_FRAG_CONT, ..] => return Verdict::Ignore,
            _ => return Verdict::Close(Malformed::UnknownKind),
        };
        if let Some((epoch, shard, seq)) = ack(body) {
            return Verdict::Ack { epoch, shard, seq };
        }
        match is_auth(body) {
            Some(answer) => Verdict::Answer(answer),
            None => Verdict::Ignore,
        }
    }
}

/// If the control of a well-formed plain `body` is `131 {6, From, Unused,
/// Name}` (`REG_SEND` to `name`), where its payload starts.
fn reg_send_to(body: &[u8], name: &str) -> Option<usize> {
    let pos = tuple(body, 1, 4)?;
    let pos =
        (body.get(pos..pos + 2)? == [etf::SMALL_INTEGER_EXT, etf::REG_SEND]).then_some(pos + 2)?;
    let pos = term_walk::term_end(body, pos)?; // From
    let pos = term_walk::term_end(body, pos)?; // Unused
    atom_is(body, pos, name)
}

/// If a well-formed plain `body` is a receiver's acknowledgement, what it
/// says: (epoch, shard, number).
fn ack(body: &[u8]) -> Option<(u64, u32, u64)> {
    let pos = reg_send_to(body, "ecall_ack")?;
    // Payload: 131 <<Epoch:64, Shard:32, Seq:64>>, and nothing after.
    let head = [
        etf::VERSION,
        etf::BINARY_EXT,
        0,
        0,
        0,
        etf::STREAM_LEN as u8,
    ];
    let data = body.get(pos..)?.strip_prefix(&head[..])?;
    if data.len() != etf::STREAM_LEN {
        return None;
    }
    let epoch = u64::from_be_bytes(data[..8].try_into().ok()?);
    let shard = u32::from_be_bytes(data[8..12].try_into().ok()?);
    let seq = u64::from_be_bytes(data[12..].try_into().ok()?);
    Some((epoch, shard, seq))
}

/// Whether `body` is one or two terms, each with its version byte, that
/// parse to the end (control and optional payload).
fn well_formed(body: &[u8]) -> bool {
    let mut pos = 0;
    for _ in 0..2 {
        if pos == body.len() {
            break;
        }
        if body[pos] != etf::VERSION {
            return false;
        }
        match term_walk::term_end(body, pos + 1) {
            Some(end) => pos = end,
            None => return false,
        }
    }
    pos == body.len() && pos > 0
}

/// Whether the atom at `inp[pos..]` is `name`; returns the position after it.
fn atom_is(inp: &[u8], pos: usize, name: &str) -> Option<usize> {
    let (_, start, len, next) = term_walk::atom_text(inp, pos)?;
    (&inp[start..start + len] == name.as_bytes()).then_some(next)
}

/// `SMALL_TUPLE_EXT` of `arity` at `inp[pos..]`; returns the position after
/// its header.
fn tuple(inp: &[u8], pos: usize, arity: u8) -> Option<usize> {
    (inp.get(pos..pos + 2)? == [etf::SMALL_TUPLE_EXT, arity]).then_some(pos + 2)
}

/// If a well-formed plain `body` is net_kernel's `is_auth` call, the frame
/// that answers it (`From ! {Tag, yes}`, as `gen:reply/2` does).
fn is_auth(body: &[u8]) -> Option<Vec<u8>> {
    let pos = reg_send_to(body, "net_kernel")?;
    // Payload: 131 {'$gen_call', {Pid, Tag}, {is_auth, _}}
    (*body.get(pos)? == etf::VERSION).then_some(())?;
    let pos = tuple(body, pos + 1, 3)?;
    let pos = atom_is(body, pos, "$gen_call")?;
    let pos = tuple(body, pos, 2)?;
    let pid = pos;
    if !matches!(body.get(pid)?, &etf::NEW_PID_EXT | &etf::PID_EXT) {
        return None;
    }
    let tag = term_walk::term_end(body, pid)?;
    let tag_end = term_walk::term_end(body, tag)?;
    let pos = tuple(body, tag_end, 2)?;
    atom_is(body, pos, "is_auth")?;
    let mut out = vec![0, 0, 0, 0, etf::PASS_THROUGH];
    out.extend_from_slice(&[etf::VERSION, etf::SMALL_TUPLE_EXT, 3]);
    out.extend_from_slice(&[etf::SMALL_INTEGER_EXT, etf::SEND]);
    etf::put_atom(&mut out, "");
    out.extend_from_slice(&body[pid..tag]);
    out.extend_from_slice(&[etf::VERSION, etf::SMALL_TUPLE_EXT, 2]);
    out.extend_from_slice(&body[tag..tag_end]);
    etf::put_atom(&mut out, "yes");
    let len = (out.len() - 4) as u32;
    out[..4].copy_from_slice(&len.to_be_bytes());
    Some(out)
}

/// Why [`read_loop`] stopped.
#[derive(Debug)]
pub enum ReadEnd {
    /// The socket failed or closed.
    Io(io::Error),
    /// The peer sent a malformed frame.
    Malformed(Malformed),
    /// Nobody writes our answers any more.
    WriterGone,
}

impl std::fmt::Display for ReadEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadEnd::Io(e) => write!(f, "read: {e}"),
            ReadEnd::Malformed(m) => write!(f, "malformed frame from the peer: {m}"),
            ReadEnd::WriterGone => f.write_str("writer gone"),
        }
    }
}

/// Reads frames until the connection fails or sends something malformed,
/// handing every answer to the writer through `replies` and every
/// acknowledgement to `ack` (epoch, shard, number; `false`: malformed);
/// counts in `stats` and returns why it stopped.
pub async fn read_loop<R: AsyncRead + Unpin>(
    rd: &mut R,
    replies: tokio::sync::mpsc::Sender<Vec<u8>>,
    stats: &InboundStats,
    ack: &(dyn Fn(u64, u32, u64) -> bool + Sync),
) -> ReadEnd {
    let mut buf = Vec::new();
    let mut inbound = Inbound::default();
    loop {
        match read_frame(rd, &mut buf).await {
            Ok(false) => {}
            Ok(true) => {
                stats.frames.fetch_add(1, Ordering::Relaxed);
                match inbound.handle(&buf) {
                    Verdict::Answer(reply) => {
                        stats.answered.fetch_add(1, Ordering::Relaxed);
                        if replies.send(reply).await.is_err() {
                            return ReadEnd::WriterGone;
                        }
                    }
                    Verdict::Ack { epoch, shard, seq } => {
                        if !ack(epoch, shard, seq) {
                            stats.malformed.fetch_add(1, Ordering::Relaxed);
                            return ReadEnd::Malformed(Malformed::BadAck);
                        }
                    }
                    Verdict::Ignore => {
                        stats.ignored.fetch_add(1, Ordering::Relaxed);
                    }
                    Verdict::Close(m) => {
                        stats.malformed.fetch_add(1, Ordering::Relaxed);
                        return ReadEnd::Malformed(m);
                    }
                }
                // A large frame's buffer is not kept for the next tick.
                if buf.capacity() > 64 * 1024 {
                    buf = Vec::new();
                }
            }
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                stats.malformed.fetch_add(1, Ordering::Relaxed);
                return ReadEnd::Malformed(Malformed::TooLarge);
            }
            Err(e) => return ReadEnd::Io(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eetf::{Atom, FixInteger, List, Pid, Reference, Term, Tuple};
    use std::io::Cursor;

    fn enc(t: &Term) -> Vec<u8> {
        let mut v = Vec::new();
        t.encode(&mut v).unwrap();
        v
    }

    fn atom(s: &str) -> Term {
        Term::from(Atom::from(s))
    }

    /// A plain frame body (pass-through byte, control, payload).
    fn plain(ctl: &Term, msg: &Term) -> Vec<u8> {
        let mut v = vec![etf::PASS_THROUGH];
        v.extend(enc(ctl));
        v.extend(enc(msg));
        v
    }

    fn reg_send(to: &str, from: &Pid) -> Term {
        Term::from(Tuple::from(vec![
            Term::from(FixInteger::from(6)),
            Term::from(from.clone()),
            atom(""),
            atom(to),
        ]))
    }

    fn is_auth_call(from: &Pid, tag: &Term) -> Term {
        Term::from(Tuple::from(vec![
            atom("$gen_call"),
            Term::from(Tuple::from(vec![Term::from(from.clone()), tag.clone()])),
            Term::from(Tuple::from(vec![atom("is_auth"), atom("b@h")])),
        ]))
    }

    #[test]
    fn answers_is_auth_and_ignores_the_rest() {
        let from = Pid::new("b@h", 42, 0, 7);
        // OTP 25+ tags a gen call with [alias | Ref]: an improper list.
        let tag = Term::from(eetf::ImproperList::from((
            vec![atom("alias")],
            Term::from(Reference {
                node: Atom::from("b@h"),
                id: vec![1, 2, 3],
                creation: 7,
            }),
        )));
        let frame = plain(&reg_send("net_kernel", &from), &is_auth_call(&from, &tag));
        let Verdict::Answer(reply) = Inbound::default().handle(&frame) else {
            panic!("no answer")
        };
        assert_eq!(
            u32::from_be_bytes(reply[..4].try_into().unwrap()) as usize,
            reply.len() - 4
        );
        let mut cur = Cursor::new(&reply[5..]);
        let rctl = Term::decode(&mut cur).unwrap();
        let rmsg = Term::decode(&mut cur).unwrap();
        assert_eq!(
            rctl,
            Term::from(Tuple::from(vec![
                Term::from(FixInteger::from(2)),
                atom(""),
                Term::from(from.clone())
            ]))
        );
        assert_eq!(rmsg, Term::from(Tuple::from(vec![tag, atom("yes")])));

        let mut inbound = Inbound::default();
        // Well formed, not for us to answer.
        let hello = plain(&reg_send("net_kernel", &from), &atom("hello"));
        assert_eq!(inbound.handle(&hello), Verdict::Ignore);
        let other = plain(
            &reg_send("someone", &from),
            &is_auth_call(&from, &atom("t")),
        );
        assert_eq!(inbound.handle(&other), Verdict::Ignore);
        // Not well formed.
        assert_eq!(
            inbound.handle(&[112, 131]),
            Verdict::Close(Malformed::BadTerm)
        );
        assert_eq!(inbound.handle(&[112]), Verdict::Close(Malformed::BadTerm));
        // A cache reference without a distribution header.
        assert_eq!(
            inbound.handle(&[112, 131, 82, 0]),
            Verdict::Close(Malformed::BadTerm)
        );
        assert_eq!(inbound.handle(&[]), Verdict::Close(Malformed::UnknownKind));
        assert_eq!(
            inbound.handle(&[1, 2, 3]),
            Verdict::Close(Malformed::UnknownKind)
        );
        let mut trailing = hello.clone();
        trailing.push(97);
        assert_eq!(
            inbound.handle(&trailing),
            Verdict::Close(Malformed::BadTerm)
        );
    }

    #[test]
    fn answers_behind_an_atom_cache_header() {
        let from = Pid::new("b@h", 42, 0, 7);
        let tag = atom("t");
        let frame = plain(&reg_send("net_kernel", &from), &is_auth_call(&from, &tag));
        let Verdict::Answer(want) = Inbound::default().handle(&frame) else {
            panic!("no answer")
        };
        let mut cache = crate::wire::conn_atom_cache::OutCache::default();
        let mut inbound = Inbound::default();
        for _ in 0..2 {
            // The first time atoms are declared, the second referred to.
            let mut cached = Vec::new();
            cache.encode(&frame[1..], &mut cached);
            assert_eq!(&cached[4..6], &[131, 68]);
            assert_eq!(inbound.handle(&cached[4..]), Verdict::Answer(want.clone()));
        }
        // A reference to an entry no header declared.
        assert_eq!(
            Inbound::default().handle(&[131, 68, 0, 82, 0]),
            Verdict::Close(Malformed::BadHeader)
        );
    }

    /// The two crashes found from outside: a term nested 10,000 levels (a
    /// recursive decoder overflowed its thread's stack) and list and tuple
    /// headers claiming 0xFFFFFFFF elements (a decoder that preallocated
    /// aborted the process).
    #[test]
    fn deep_and_huge_terms_neither_recurse_nor_allocate() {
        let from = Pid::new("b@h", 42, 0, 7);
        let ctl = enc(&reg_send("net_kernel", &from));
        // [[[[...]]]] 1,000,000 levels deep, as list and as tuple.
        for (open, close) in [
            (&[etf::LIST_EXT, 0, 0, 0, 1][..], &[etf::NIL_EXT][..]),
            (&[etf::SMALL_TUPLE_EXT, 1][..], &[][..]),
        ] {
            let depth = 1_000_000;
            let mut frame = vec![etf::PASS_THROUGH];
            frame.extend(&ctl);
            frame.push(etf::VERSION);
            for _ in 0..depth {
                frame.extend_from_slice(open);
            }
            frame.push(etf::NIL_EXT);
            for _ in 0..depth {
                frame.extend_from_slice(close);
            }
            assert_eq!(Inbound::default().handle(&frame), Verdict::Ignore);
            // The same in the control term.
            let mut deep_ctl = vec![etf::PASS_THROUGH, etf::VERSION];
            deep_ctl.extend_from_slice(&frame[ctl.len() + 2..]);
            assert_eq!(Inbound::default().handle(&deep_ctl), Verdict::Ignore);
        }
        for huge in [
            vec![etf::LIST_EXT, 0xff, 0xff, 0xff, 0xff, etf::NIL_EXT],
            vec![etf::LARGE_TUPLE_EXT, 0xff, 0xff, 0xff, 0xff],
            vec![etf::MAP_EXT, 0xff, 0xff, 0xff, 0xff],
            vec![etf::BINARY_EXT, 0xff, 0xff, 0xff, 0xff, 1],
            vec![etf::STRING_EXT, 0xff, 0xff, 1],
        ] {
            let mut frame = vec![etf::PASS_THROUGH];
            frame.extend(&ctl);
            frame.push(etf::VERSION);
            frame.extend(&huge);
            assert_eq!(
                Inbound::default().handle(&frame),
                Verdict::Close(Malformed::BadTerm)
            );
        }
        // A well-formed list of a million elements is just walked.
        let long = Term::from(List::from(vec![Term::from(FixInteger::from(1)); 1_000_000]));
        let frame = plain(&reg_send("x", &from), &long);
        assert_eq!(Inbound::default().handle(&frame), Verdict::Ignore);
    }

    /// A handful of references that would each expand to a 60 KB atom.
    #[test]
    fn reference_expansion_is_bounded() {
        let text = "a".repeat(60_000);
        // Declare one long atom (long-atoms flag set), then refer to it
        // many times in one frame.
        let mut frame = vec![131, 68, 1, 0x08 | 0x10, 0];
        frame.extend_from_slice(&(text.len() as u16).to_be_bytes());
        frame.extend_from_slice(text.as_bytes());
        frame.extend_from_slice(&[etf::LIST_EXT, 0, 0, 0x10, 0]);
        for _ in 0..0x1000 {
            frame.extend_from_slice(&[82, 0]);
        }
        frame.push(etf::NIL_EXT);
        assert_eq!(
            Inbound::default().handle(&frame),
            Verdict::Close(Malformed::BadHeader)
        );
    }

    #[tokio::test]
    async fn oversized_frames_are_refused_before_they_are_read() {
        let mut input: &[u8] = &[0xff, 0xff, 0xff, 0xff, 1, 2, 3];
        let mut buf = Vec::new();
        let e = read_frame(&mut input, &mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(buf.capacity() < 1024);
        let stats = InboundStats::default();
        let (tx, _rx) = tokio::sync::mpsc::channel(1);
        let mut input: &[u8] = &[0, 0, 0, 0, 0, 0, 0, 2, 1, 2];
        let end = read_loop(&mut input, tx, &stats, &|_, _, _| true).await;
        assert!(
            matches!(end, ReadEnd::Malformed(Malformed::UnknownKind)),
            "{end}"
        );
        assert_eq!(stats.malformed.load(Ordering::Relaxed), 1);
    }
}
