//! The distribution flags (OTP's `DFLAG_*`, erl_dist_protocol): what the
//! identities offer in their handshakes, and what the links need a peer
//! to understand.
//!
//! Spelled out rather than taken from erl_dist 0.8, whose
//! `MANDATORY_25_DIGEST` is not OTP's bit (see [`flags`]).

use erl_dist::DistributionFlags;

/// `DFLAG_EXTENDED_REFERENCES`: references with several id words.
pub const EXTENDED_REFERENCES: u64 = 0x4;
/// `DFLAG_FUN_TAGS`: `FUN_EXT`.
pub const FUN_TAGS: u64 = 0x10;
/// `DFLAG_NEW_FUN_TAGS`: `NEW_FUN_EXT`.
pub const NEW_FUN_TAGS: u64 = 0x80;
/// `DFLAG_EXTENDED_PIDS_PORTS`: pids and ports with wider fields.
pub const EXTENDED_PIDS_PORTS: u64 = 0x100;
/// `DFLAG_EXPORT_PTR_TAG`: `EXPORT_EXT`.
pub const EXPORT_PTR_TAG: u64 = 0x200;
/// `DFLAG_BIT_BINARIES`: `BIT_BINARY_EXT`.
pub const BIT_BINARIES: u64 = 0x400;
/// `DFLAG_NEW_FLOATS`: `NEW_FLOAT_EXT`.
pub const NEW_FLOATS: u64 = 0x800;
/// `DFLAG_DIST_HDR_ATOM_CACHE`: the distribution header and its atom
/// cache ([`crate::wire::conn_atom_cache`]).
pub const DIST_HDR_ATOM_CACHE: u64 = 0x2000;
/// `DFLAG_UTF8_ATOMS`: UTF-8 atoms.
pub const UTF8_ATOMS: u64 = 0x1_0000;
/// `DFLAG_MAP_TAG`: `MAP_EXT`.
pub const MAP_TAG: u64 = 0x2_0000;
/// `DFLAG_BIG_CREATION`: 32-bit creations (`NEW_PID_EXT` and the like).
pub const BIG_CREATION: u64 = 0x4_0000;
/// `DFLAG_FRAGMENTS`: large messages in fragments ([`crate::wire::fragment`]).
pub const FRAGMENTS: u64 = 0x80_0000;
/// `DFLAG_HANDSHAKE_23`: the OTP 23 handshake.
pub const HANDSHAKE_23: u64 = 0x100_0000;
/// `DFLAG_UNLINK_ID`: the new link protocol (mandatory from OTP 26).
pub const UNLINK_ID: u64 = 0x200_0000;
/// `DFLAG_MANDATORY_25_DIGEST`: the flags OTP 25 made mandatory.
pub const MANDATORY_25_DIGEST: u64 = 0x400_0000;
/// `DFLAG_V4_NC`: 64-bit port numbers and more reference words (mandatory
/// from OTP 26).
pub const V4_NC: u64 = 1 << 34;

/// `DFLAG_ALIAS`: `ALIAS_SEND` control messages (OTP 24+).
pub const ALIAS: u64 = 1 << 35;

/// Distribution flags offered on links we open: the base set, the atom
/// cache (see [`crate::wire::conn_atom_cache`]), fragments (large messages go out
/// in pieces, interleaved with others) and aliases (a big call result goes
/// straight to the caller's alias: `ALIAS_SEND`, see
/// [`crate::wire::etf::BatchHeader::direct`]).
pub fn link_flags() -> DistributionFlags {
    DistributionFlags::from_bits_truncate(flags().bits() | DIST_HDR_ATOM_CACHE | FRAGMENTS | ALIAS)
}

/// Distribution flags offered on connections we accept (pings and the
/// like: nothing to gain from the atom cache there).
///
/// erl_dist 0.8's `MANDATORY_25_DIGEST` is bit 36, which OTP 26+ uses for
/// `LOCAL_EXT`; OTP's real value is `0x04000000` ([`MANDATORY_25_DIGEST`]),
/// so the set is spelled out. No fragments here (nothing large goes out on
/// accepted connections), no monitors (we do not answer them). `V4_NC` and
/// `UNLINK_ID` are mandatory from OTP 26.
pub fn flags() -> DistributionFlags {
    DistributionFlags::from_bits_truncate(DIGEST_25 | MANDATORY_25_DIGEST | UNLINK_ID | V4_NC)
}

/// The flags OTP 25's `DFLAG_MANDATORY_25_DIGEST` stands for (a peer that
/// sets that bit has all of them): [`REQUIRED_FLAGS`], which are exactly
/// that set.
pub const DIGEST_25: u64 = {
    let mut bits = 0;
    let mut i = 0;
    while i < REQUIRED_FLAGS.len() {
        bits |= REQUIRED_FLAGS[i].0;
        i += 1;
    }
    bits
};

/// What the links need a peer to understand: the encodings that
/// `term_to_binary` on an OTP 25+ node writes into the frames (new pids,
/// references and floats, UTF-8 atoms, maps, funs, bit binaries) and the
/// OTP 23 handshake. A peer without one of them would misread the frames,
/// so it is refused, by name ([`missing_flags`]).
pub const REQUIRED_FLAGS: [(u64, &str); 11] = [
    (EXTENDED_REFERENCES, "DFLAG_EXTENDED_REFERENCES"),
    (FUN_TAGS, "DFLAG_FUN_TAGS"),
    (EXTENDED_PIDS_PORTS, "DFLAG_EXTENDED_PIDS_PORTS"),
    (NEW_FUN_TAGS, "DFLAG_NEW_FUN_TAGS"),
    (EXPORT_PTR_TAG, "DFLAG_EXPORT_PTR_TAG"),
    (BIT_BINARIES, "DFLAG_BIT_BINARIES"),
    (NEW_FLOATS, "DFLAG_NEW_FLOATS"),
    (UTF8_ATOMS, "DFLAG_UTF8_ATOMS"),
    (MAP_TAG, "DFLAG_MAP_TAG"),
    (BIG_CREATION, "DFLAG_BIG_CREATION"),
    (HANDSHAKE_23, "DFLAG_HANDSHAKE_23"),
];

/// The names of the [`REQUIRED_FLAGS`] that a peer offering `peer` lacks.
pub fn missing_flags(peer: u64) -> Vec<&'static str> {
    let have = if peer & MANDATORY_25_DIGEST != 0 {
        peer | DIGEST_25
    } else {
        peer
    };
    REQUIRED_FLAGS
        .iter()
        .filter(|(bit, _)| have & bit == 0)
        .map(|(_, name)| *name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_flags_are_named_and_the_digest_counts_as_all() {
        assert_eq!(missing_flags(flags().bits()), Vec::<&str>::new());
        assert_eq!(missing_flags(MANDATORY_25_DIGEST), Vec::<&str>::new());
        assert_eq!(missing_flags(DIGEST_25), Vec::<&str>::new());
        assert_eq!(
            missing_flags(DIGEST_25 & !UTF8_ATOMS),
            vec!["DFLAG_UTF8_ATOMS"]
        );
        assert_eq!(
            missing_flags(DIGEST_25 & !(MAP_TAG | HANDSHAKE_23)),
            vec!["DFLAG_MAP_TAG", "DFLAG_HANDSHAKE_23"]
        );
        assert_eq!(missing_flags(0).len(), REQUIRED_FLAGS.len());
    }

    /// The named flags are the set this module used to offer as one literal.
    #[test]
    fn named_flags_are_the_old_literal() {
        let old = DistributionFlags::from_bits_truncate(
            0x0107_0f94
                | 0x0400_0000
                | DistributionFlags::UNLINK_ID.bits()
                | DistributionFlags::V4_NC.bits(),
        );
        assert_eq!(flags().bits(), old.bits());
        assert_eq!(
            EXTENDED_REFERENCES
                | FUN_TAGS
                | NEW_FUN_TAGS
                | EXTENDED_PIDS_PORTS
                | EXPORT_PTR_TAG
                | BIT_BINARIES
                | NEW_FLOATS
                | UTF8_ATOMS
                | MAP_TAG
                | BIG_CREATION
                | HANDSHAKE_23,
            0x0107_0f94
        );
        assert_eq!(UNLINK_ID, DistributionFlags::UNLINK_ID.bits());
        assert_eq!(V4_NC, DistributionFlags::V4_NC.bits());
        assert_eq!(ALIAS, DistributionFlags::ALIAS.bits());
        // Nothing is lost to from_bits_truncate: erl_dist knows every bit.
        let named = flags().bits();
        assert_eq!(named, 0x0107_0f94 | MANDATORY_25_DIGEST | UNLINK_ID | V4_NC);
        assert_eq!(
            link_flags().bits(),
            named | DIST_HDR_ATOM_CACHE | FRAGMENTS | ALIAS
        );
    }
}
