//! The distribution wire format, as bytes: the external term format and
//! the batch header ([`etf`]), the distribution flags a handshake offers
//! and needs ([`dist_flags`]), the process-wide atom ids written at encode
//! time ([`fixed_atom_ids`]), each connection's distribution atom cache
//! ([`conn_atom_cache`]), frames ([`frame`]), large messages in
//! fragments ([`fragment`]), and the term walker they share
//! ([`term_walk`]).
//!
//! Pure functions and constants: nothing here touches a socket, a queue
//! or a thread.

pub mod conn_atom_cache;
pub mod dist_flags;
pub mod etf;
pub mod fixed_atom_ids;
pub mod fragment;
pub mod frame;
pub mod term_walk;
