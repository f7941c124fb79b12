//! The one encode of each request, in place of `enif_term_to_binary`.
//!
//! Why: the encode is most of a push, and most of the encode of a typical
//! message is its atoms. `term_to_binary` looks up and writes out the text
//! of every atom every time; here an atom's encoding is looked up in a
//! small per-thread memo of atom encodings keyed by the atom's term word
//! (atoms never move or die, so the word names the atom for the life of
//! the VM), and so is a local pid's ([`atom_memo`]); another node's pid or port
//! is cached by hash and checked against a copy of it ([`remote`]). The
//! bytes go straight into a per-thread buffer that the shard copies from,
//! instead of a fresh refc binary per push. The figures are in
//! doc/performance.md (the run of record, and "Ideas kept").
//!
//! What: plain external format, no version byte (what a shard splices into
//! a batch). Integers that fit 64 bits, floats, atoms, binaries, tuples,
//! lists (improper ones too) and maps are written here
//! ([`write`](mod@write)); any other subterm (pids, ports, references,
//! funs, bigger integers, bitstrings) and every atom the memo has not seen
//! yet is written by `enif_term_to_binary` on its own, so every term
//! encodes, and decodes to an equal term
//! (`ecall_data_path_SUITE:every_term_kind_arrives_equal`).
//!
//! Atoms as id references: an atom gets a process-wide id the first time
//! the encoder meets it (`ecall_dist::wire::fixed_atom_ids`, the encode-time atom ids:
//! the first `IDS` atoms met), and is written as `ATOM_CACHE_REF id` from then
//! on, a reference into the distribution atom cache of the connection
//! (`ecall_dist::wire::conn_atom_cache`), whose slot `id` every connection declares
//! for that atom. So the link writer puts a header in front of the batch
//! instead of passing over its bytes. The node atom in a pid, port or
//! reference is rewritten the same way. An element that keeps some atom as
//! text (past those, or inside a fun) says so (`Encoded::text`), and the
//! writer passes over its bytes (`ecall_dist::wire::conn_atom_cache::OutCache::encode`).
//!
//! Depth costs no stack: the walk ([`walk`]) keeps the terms still to
//! write on a vector, so a deeply nested term cannot overflow a
//! scheduler's stack. Size costs no scheduler time past a bound: a push
//! gives up once the encoding passes [`INLINE_MAX`] and answers `large`,
//! and the Erlang side has it encoded and copied on a dirty scheduler
//! (`encode_large/1`).
//!
//! Tests: [`atom_memo`] (with `atom_memo::two_way`, the table it is built
//! on), [`dests`], [`front`] and [`write`](mod@write) never call into the
//! VM, and are unit tested without it (`pure_tests.rs`, a test target of
//! their own: a test binary of the NIF library could not link the VM's
//! `enif_*` symbols). The walk and [`remote`] are tested through Common
//! Test (`ecall_data_path_SUITE`: every kind of term, through `encode/1`).

mod atom_memo;
mod dests;
pub mod front;
mod remote;
mod walk;
mod write;

pub use atom_memo::new_epoch;
pub use walk::{cells_upto, dests_with, term_with, tuple_with, word};

use ecall_dist::Element;

/// A push gives up encoding a request whose encoding passes this many
/// bytes (or that holds a binary, a tuple or a map that would take it past
/// them), and says `large`: the caller then has it encoded and pushed
/// on a dirty scheduler (`encode_large/1`, `push_encoded/4`). This bounds
/// the time one push holds a normal scheduler, whatever the term: a push
/// gives up a list of a million integers, or a map of thousands of pairs,
/// in a small part of a millisecond (doc/performance.md, "Ideas kept", the
/// NIF's own encoder), where without the bound the list would hold the
/// scheduler for its whole encode.
pub const INLINE_MAX: usize = 16 * 1024;

// Any request encoded on a normal scheduler may be written alone by its
// caller: the largest request written alone (`LONE_MAX`) is this bound.
const _: () = assert!(
    INLINE_MAX == ecall_dist::internals::tuning::LONE_MAX,
    "LONE_MAX (ecall_dist link/tuning.rs) must equal INLINE_MAX"
);

/// One encoded element, as [`term_with`] and [`tuple_with`] hand it over.
pub struct Encoded<'b> {
    /// External format without the version byte.
    pub bytes: &'b [u8],
    /// Whether some atom in it is text (else all are id references).
    pub text: bool,
    /// Atoms written as id references.
    pub refs: u64,
    /// The encode gave up past its limit: `bytes` is incomplete.
    pub large: bool,
}

impl Encoded<'_> {
    /// What a push hands the shard (`urgent`: see [`Element::urgent`]).
    pub fn element(&self, urgent: bool) -> Element<'_> {
        Element {
            bytes: self.bytes,
            text: self.text,
            refs: u32::try_from(self.refs).unwrap_or(u32::MAX),
            urgent,
        }
    }
}
