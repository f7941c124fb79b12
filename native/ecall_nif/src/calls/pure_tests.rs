//! The root of the call table's unit tests (`cargo test -p ecall_nif`):
//! `calls/table.rs`, which never calls into the VM, compiled here on its
//! own with its `#[cfg(test)]` module (why a target of its own:
//! `encode/pure_tests.rs`).

mod table;
