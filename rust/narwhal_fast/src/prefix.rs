//! Python binding of the per-engine prefix index (`PrefixIndex`, `PrefixProbe`): converts
//! arguments and results only.

use narwhal_core::prefix::PrefixIndex;
use pyo3::prelude::*;

/// One prompt's chunk hashes and, per engine, the leading chunks it held when probed.
#[pyclass(module = "narwhal._narwhal_fast", name = "PrefixProbe", frozen)]
pub struct PyPrefixProbe {
    hashes: Vec<u64>,
    matched: Vec<usize>,
}

#[pymethods]
impl PyPrefixProbe {
    #[getter]
    fn chunks(&self) -> usize {
        self.hashes.len()
    }

    /// Leading chunks `engine` held at the probe (0 for an engine out of range).
    fn matched(&self, engine: usize) -> usize {
        self.matched.get(engine).copied().unwrap_or(0)
    }
}

/// The prefix index of every engine (one per capacity, in hashes).
#[pyclass(module = "narwhal._narwhal_fast", name = "PrefixIndex")]
pub struct PyPrefixIndex {
    index: PrefixIndex,
}

#[pymethods]
impl PyPrefixIndex {
    #[new]
    #[pyo3(signature = (capacities, chunk_bytes = 64))]
    fn new(capacities: Vec<usize>, chunk_bytes: usize) -> Self {
        PyPrefixIndex {
            index: PrefixIndex::new(&capacities, chunk_bytes),
        }
    }

    #[getter]
    fn chunk_bytes(&self) -> usize {
        self.index.chunk_bytes()
    }

    /// Hash `text`'s chunks and match them against every engine.
    fn probe(&self, text: &str) -> PyPrefixProbe {
        let hashes = self.index.hashes(text.as_bytes());
        let matched = if hashes.is_empty() {
            Vec::new()
        } else {
            (0..self.index.engines())
                .map(|engine| self.index.matched(engine, &hashes))
                .collect()
        };
        PyPrefixProbe { hashes, matched }
    }

    /// Record a placement of the probed prompt on `engine`; return the chunks it held.
    fn insert(&mut self, engine: usize, probe: &PyPrefixProbe) -> usize {
        self.index.insert(engine, &probe.hashes)
    }

    /// The engine holds only the probe's first `keep` chunks: forget the rest there.
    fn forget(&mut self, engine: usize, probe: &PyPrefixProbe, keep: usize) {
        let keep = keep.min(probe.hashes.len());
        self.index.forget(engine, &probe.hashes[keep..]);
    }

    /// A new engine in slot `engine` (growing the index to hold it): it holds nothing yet.
    fn reset(&mut self, engine: usize, capacity: usize) {
        self.index.reset(engine, capacity);
    }

    fn set_capacity(&mut self, engine: usize, capacity: usize) {
        self.index.set_capacity(engine, capacity);
    }

    /// `(blocks held, capacity, chunks placed, of them matched)`, or None out of range.
    fn state(&self, engine: usize) -> Option<(usize, usize, u64, u64)> {
        self.index
            .state(engine)
            .map(|s| (s.blocks, s.capacity, s.placed_chunks, s.matched_chunks))
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPrefixIndex>()?;
    m.add_class::<PyPrefixProbe>()?;
    Ok(())
}
