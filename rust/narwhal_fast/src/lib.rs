//! The `narwhal._narwhal_fast` Python module: a list of exports, nothing else.
use pyo3::prelude::*;

mod counters;
mod stream;

#[pymodule]
fn _narwhal_fast(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    counters::register(m)?;
    stream::register(m)?;
    Ok(())
}
