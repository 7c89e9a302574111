//! narwhal_core: the per-token path of the Narwhal router, in plain Rust.
pub mod assemble;
pub mod chunked;
pub mod counters;
pub mod delta;
pub mod error;
pub mod expose;
pub mod histogram;
pub mod otlp;
pub mod outcome;
pub mod prefix;
pub mod session;
pub mod shm;
pub mod snapshot;
pub mod sse;
pub mod token_ids;
pub mod workers;
