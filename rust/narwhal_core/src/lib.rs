//! narwhal_core: the per-token path of the Narwhal router, in plain Rust.
pub mod counters;
pub mod histogram;
pub mod outcome;
pub mod shm;
pub mod snapshot;
pub mod workers;
pub mod assemble;
pub mod delta;
pub mod error;
pub mod expose;
pub mod session;
pub mod sse;
pub mod token_ids;
