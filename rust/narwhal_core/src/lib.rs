//! narwhal_core: the per-token path of the Narwhal router, in plain Rust.
