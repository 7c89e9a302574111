//! The `narwhal._narwhal_fast` Python module: a list of exports, nothing else.
use pyo3::prelude::*;

mod counters;
mod otlp;
mod prefix;
mod stream;

#[pymodule]
fn _narwhal_fast(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // What `narwhal --version` reports: an unoptimised (debug-assertion) build is "debug".
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    m.add("BUILD_PROFILE", profile)?;
    counters::register(m)?;
    stream::register(m)?;
    prefix::register(m)?;
    otlp::register(m)?;
    Ok(())
}
