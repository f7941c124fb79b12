//! The root of the encoder's unit tests (`cargo test -p ecall_nif`): the
//! parts of the `encode` folder that never call into the VM,
//! compiled here on their own, with their `#[cfg(test)]` modules.
//!
//! Why a target of its own: the NIF library's test binary would link the
//! VM's `enif_*` functions, which only the VM provides (the library itself
//! leaves them to the VM's loader), so the library is not built as a test
//! (`test = false`). These modules name nothing of rustler, and nothing of
//! this crate but through `super::` (here, as in `encode/mod.rs`, the
//! module that holds them both), so they compile alike in both.

mod atom_memo;
mod dests;
mod front;
mod write;
