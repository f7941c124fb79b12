//! The network: writes with a stall deadline ([`stall_write`]), TCP and TLS
//! streams ([`stream`]) and TLS configuration ([`tls`]), the checked
//! reading of what a peer sends ([`inbound`]), and the C-node, in files
//! named after its protocol steps: an identity ([`identity`]) registers
//! its name with epmd ([`epmd`]), listens and accepts ([`accept`]), with
//! the incoming handshakes it lets wait ([`pending`]) and its warnings a
//! flood would repeat, let through at most once per period
//! ([`log_every`]); links connect out under it ([`connect`]); both sides
//! run the distribution handshake ([`handshake`]).
//!
//! Everything read here is hostile until checked (see [`inbound`]).

pub(crate) mod accept;
pub mod connect;
pub(crate) mod epmd;
pub(crate) mod handshake;
pub mod identity;
pub mod inbound;
pub(crate) mod log_every;
pub mod pending;
pub(crate) mod stall_write;
pub mod stream;
pub mod tls;
