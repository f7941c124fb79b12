//! The network: writes with a stall deadline ([`stall_write`]), what a
//! socket took ([`sent`]), TCP and TLS streams ([`stream`]), the checked
//! reading of what a peer sends ([`inbound`]), and the C-node's identity:
//! epmd, listener and handshake ([`cnode`]), with the incoming handshakes
//! it lets wait ([`pending`]) and its warnings a flood would repeat, let
//! through at most once per period ([`log_every`]).
//!
//! Everything read here is hostile until checked (see [`inbound`]).

pub mod cnode;
pub(crate) mod epmd;
pub(crate) mod handshake;
pub mod inbound;
pub(crate) mod log_every;
pub mod pending;
pub(crate) mod sent;
pub(crate) mod stall_write;
pub mod stream;
