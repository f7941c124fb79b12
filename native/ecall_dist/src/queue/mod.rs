//! The queue between the callers and a link's writer: lock-sharded batches
//! built in place ([`shard`]) under one byte budget per peer ([`budget`]).
//!
//! It knows nothing of links or sockets: callers push into it, a writer
//! takes whole frames out of it.

pub(crate) mod budget;
pub mod shard;
