//! Reading distribution frames after the handshake, and the few control
//! messages a C-node must answer.
//!
//! A connected peer sends ticks (empty frames) and, rarely, messages to our
//! node: the only one we answer is net_kernel's `is_auth` call, which is
//! what `net_adm:ping/1` sends. Everything else is read and ignored, so that
//! the peer's writes never block on a full socket buffer.

use crate::atom_cache::InCache;
use crate::etf;
use eetf::{Atom, FixInteger, Term, Tuple};
use std::io::{self, Cursor};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Largest incoming frame we accept. We expect only ticks and tiny control
/// messages; anything larger is a protocol error, not something to buffer.
pub const MAX_INCOMING_FRAME: usize = 16 << 20;

/// The empty frame that keeps a connection alive.
pub const TICK: [u8; 4] = [0, 0, 0, 0];

/// Reads one frame into `buf`. Returns `Ok(false)` for a tick.
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
            format!("incoming frame of {len} bytes"),
        ));
    }
    buf.resize(len, 0);
    r.read_exact(buf).await?;
    Ok(true)
}

/// The receiving half of a connection: expands atom cache references
/// (keeping the connection's cache current) and answers what calls for it.
#[derive(Debug, Default)]
pub struct Inbound {
    cache: Option<InCache>,
}

impl Inbound {
    /// Given one incoming frame (without its length), returns the frame to
    /// send back (a plain pass-through frame), if the message calls for an
    /// answer. Frames with a distribution header are decoded first, always,
    /// since later frames may refer to cache entries they create.
    pub fn answer(&mut self, frame: &[u8]) -> Option<Vec<u8>> {
        if let Some(body) = frame.strip_prefix(&[etf::PASS_THROUGH]) {
            return answer(body);
        }
        let body = self
            .cache
            .get_or_insert_with(InCache::default)
            .decode(frame)?;
        answer(&body)
    }
}

/// Reads frames until the connection fails, handing every answer to the
/// writer through `replies`; returns why it stopped.
pub async fn read_loop<R: AsyncRead + Unpin>(
    rd: &mut R,
    replies: tokio::sync::mpsc::Sender<Vec<u8>>,
) -> String {
    let mut buf = Vec::new();
    let mut inbound = Inbound::default();
    loop {
        match read_frame(rd, &mut buf).await {
            Ok(false) => {}
            Ok(true) => {
                if let Some(reply) = inbound.answer(&buf) {
                    if replies.send(reply).await.is_err() {
                        return "writer gone".to_string();
                    }
                }
            }
            Err(e) => return format!("read: {e}"),
        }
    }
}

/// Given the body of a pass-through frame (control and payload, each with
/// its version byte), returns the frame to send back, if any.
pub fn answer(body: &[u8]) -> Option<Vec<u8>> {
    let mut cur = Cursor::new(body);
    let control = Term::decode(&mut cur).ok()?;
    let Term::Tuple(Tuple { elements: ctl }) = control else {
        return None;
    };
    // {REG_SEND, From, Unused, ToName}
    match ctl.as_slice() {
        [Term::FixInteger(FixInteger { value: 6 }), _, _, Term::Atom(to)]
            if to.name == "net_kernel" => {}
        _ => return None,
    }
    let payload = Term::decode(&mut cur).ok()?;
    let Term::Tuple(Tuple { elements: call }) = payload else {
        return None;
    };
    let [Term::Atom(gen_call), Term::Tuple(Tuple { elements: from }), Term::Tuple(Tuple { elements: req })] =
        call.as_slice()
    else {
        return None;
    };
    if gen_call.name != "$gen_call" {
        return None;
    }
    let [Term::Pid(pid), tag] = from.as_slice() else {
        return None;
    };
    match req.as_slice() {
        [Term::Atom(a), _] if a.name == "is_auth" => {}
        _ => return None,
    }
    // gen:reply/2: From ! {Tag, Reply}
    let control = Term::from(Tuple::from(vec![
        Term::from(FixInteger::from(i32::from(etf::SEND))),
        Term::from(Atom::from("")),
        Term::from(pid.clone()),
    ]));
    let reply = Term::from(Tuple::from(vec![
        tag.clone(),
        Term::from(Atom::from("yes")),
    ]));
    Some(frame_of(&control, &reply))
}

/// Encodes a complete frame: length, pass-through, control, payload.
pub fn frame_of(control: &Term, payload: &Term) -> Vec<u8> {
    let mut out = vec![0, 0, 0, 0, etf::PASS_THROUGH];
    // Encoding into a Vec cannot fail for these plain terms.
    let _ = control.encode(&mut out);
    let _ = payload.encode(&mut out);
    let len = (out.len() - 4) as u32;
    out[..4].copy_from_slice(&len.to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use eetf::{Pid, Reference};

    #[test]
    fn answers_is_auth_and_ignores_the_rest() {
        let from = Pid::new("b@h", 42, 0, 7);
        let tag = Term::from(Reference {
            node: Atom::from("b@h"),
            id: vec![1, 2, 3],
            creation: 7,
        });
        let ctl = Term::from(Tuple::from(vec![
            Term::from(FixInteger::from(6)),
            Term::from(from.clone()),
            Term::from(Atom::from("")),
            Term::from(Atom::from("net_kernel")),
        ]));
        let call = Term::from(Tuple::from(vec![
            Term::from(Atom::from("$gen_call")),
            Term::from(Tuple::from(vec![Term::from(from.clone()), tag.clone()])),
            Term::from(Tuple::from(vec![
                Term::from(Atom::from("is_auth")),
                Term::from(Atom::from("b@h")),
            ])),
        ]));
        let frame = frame_of(&ctl, &call);
        let reply = Inbound::default().answer(&frame[4..]).expect("an answer");
        let mut cur = Cursor::new(&reply[5..]);
        let rctl = Term::decode(&mut cur).unwrap();
        let rmsg = Term::decode(&mut cur).unwrap();
        assert_eq!(
            rctl,
            Term::from(Tuple::from(vec![
                Term::from(FixInteger::from(2)),
                Term::from(Atom::from("")),
                Term::from(from)
            ]))
        );
        assert_eq!(
            rmsg,
            Term::from(Tuple::from(vec![tag, Term::from(Atom::from("yes"))]))
        );

        let other = Term::from(Atom::from("hello"));
        let mut inbound = Inbound::default();
        assert!(inbound.answer(&frame_of(&ctl, &other)[4..]).is_none());
        assert!(inbound.answer(&[112, 131]).is_none());
        assert!(inbound.answer(&[]).is_none());

        // The same call behind a distribution header with cached atoms.
        let mut cache = crate::atom_cache::OutCache::default();
        let mut cached = Vec::new();
        cache.encode(&frame[5..], &mut cached);
        assert_eq!(&cached[4..6], &[131, 68]);
        assert_eq!(inbound.answer(&cached[4..]), Some(reply));
    }
}
