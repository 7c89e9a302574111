//! narwhal_core: the per-token path of the Narwhal router, in plain Rust.
pub mod counters;
pub mod histogram;
pub mod shm;
