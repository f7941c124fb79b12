//! Atom references chosen at encode time: one process-wide table of the
//! first [`IDS`] atoms the encoder meets, each with a fixed id.
//!
//! Why: the link writer used to pass over every byte of every batch to
//! rewrite atoms into cache references (a third of its time, about 0.6 µs
//! per message of the benchmark's payload). Now the NIF's encoder writes
//! an atom that has an id as `ATOM_CACHE_REF id` right away, and the writer
//! only puts a distribution header in front that lists ids `0..count()`
//! in order, so that reference `i` of the header is id `i`: no walk.
//!
//! How the peer's cache stays right: id `i` always lives in the peer's
//! cache slot `i` (segment 0). A connection declares each id with its text
//! the first time a header lists it (`OutCache::declared`), and refers to
//! it by slot afterwards; a new connection starts with nothing declared.
//! The per-connection cache of [`crate::wire::conn_atom_cache`] (for atoms without an
//! id) keeps to slots 256 and up, so the two never overwrite each other.
//!
//! Ids are never reused or taken back (atoms live as long as the VM), so
//! an element encoded with an id stays valid on every connection. Atoms
//! past the first [`IDS`], atoms longer than 255 bytes and atoms in
//! Latin-1 that is not ASCII go as text, through the per-connection cache.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Most ids: the rest of a header's 255 references are for the
/// per-connection cache.
pub const IDS: usize = 200;

static TEXTS: [OnceLock<Box<[u8]>>; IDS] = [const { OnceLock::new() }; IDS];
/// Ids given so far; `TEXTS[..COUNT]` are all set.
static COUNT: AtomicUsize = AtomicUsize::new(0);
static BY_TEXT: Mutex<Option<HashMap<Box<[u8]>, u8>>> = Mutex::new(None);

/// The id of the atom whose UTF-8 text is `text`, given now if it has none
/// and there is room; `None` when the table is full or the text is longer
/// than 255 bytes. Takes a lock: for the encoder's first meeting
/// with an atom (it caches the answer), not for every atom.
pub fn id_of(text: &[u8]) -> Option<u8> {
    if text.len() > 255 {
        // Long ones would need the header's long-atom flag, which the ids'
        // headers do without.
        return None;
    }
    let mut g = BY_TEXT.lock().unwrap_or_else(|p| p.into_inner());
    let map = g.get_or_insert_with(HashMap::new);
    if let Some(&id) = map.get(text) {
        return Some(id);
    }
    let n = COUNT.load(Ordering::Relaxed);
    if n >= IDS {
        return None;
    }
    // Only this function sets texts, under the lock, each slot once.
    let _ = TEXTS[n].set(text.into());
    map.insert(text.into(), n as u8);
    // Published after the text: whoever sees the count sees the texts.
    COUNT.store(n + 1, Ordering::Release);
    Some(n as u8)
}

/// Ids given so far (ids `0..count()` have texts).
pub fn count() -> usize {
    COUNT.load(Ordering::Acquire)
}

/// The text of id `id`, if it has been given.
pub fn text(id: u8) -> Option<&'static [u8]> {
    TEXTS.get(usize::from(id))?.get().map(|t| &**t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_texts_match() {
        let a = id_of(b"atom_ids_test_a").unwrap();
        let b = id_of(b"atom_ids_test_b").unwrap();
        assert_ne!(a, b);
        assert_eq!(id_of(b"atom_ids_test_a"), Some(a));
        assert_eq!(text(a), Some(&b"atom_ids_test_a"[..]));
        assert!(count() > usize::from(a.max(b)));
        assert_eq!(text(id_of(b"").unwrap()), Some(&b""[..]));
        assert_eq!(id_of(&[b'x'; 256]), None);
    }
}
