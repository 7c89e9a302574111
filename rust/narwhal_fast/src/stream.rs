//! Python binding of the stream core (`StreamSession`, `StreamError`): converts only.

use std::sync::OnceLock;
use std::time::Instant;

use narwhal_core::error::StreamError as CoreError;
use narwhal_core::session::{pump_flags, Options, Route, StreamSession};
use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// `time.monotonic()` read at import, with the `Instant` of the same moment: `monotonic()`
/// below is Python's clock (CLOCK_MONOTONIC on Linux, as `Instant`) without a Python call.
static CLOCK: OnceLock<(Instant, f64)> = OnceLock::new();

fn monotonic() -> f64 {
    CLOCK
        .get()
        .map_or(0.0, |(at, base)| base + at.elapsed().as_secs_f64())
}

pyo3::create_exception!(
    narwhal._narwhal_fast,
    StreamError,
    PyValueError,
    "An engine stream failed or cannot be assembled; `.code` and `.message` say why."
);

fn stream_error(py: Python<'_>, e: &CoreError) -> PyErr {
    if let CoreError::NotAssembling = e {
        return PyValueError::new_err(e.to_string());
    }
    let message = e.to_string();
    let err = StreamError::new_err(message.clone());
    let value = err.value(py);
    // Attributes on a fresh exception instance cannot fail.
    let _ = value.setattr("code", e.code());
    let _ = value.setattr("message", message);
    err
}

/// One engine attempt's stream; `feed` once per network read.
#[pyclass(module = "narwhal._narwhal_fast", name = "StreamSession")]
pub struct PyStreamSession {
    inner: StreamSession,
    /// `pump` writes the client's chunks here (the client transport's `write`).
    writer: Option<Py<PyAny>>,
    /// `pump` keeps this object's `tokens` attribute current (the attempt's occupancy track).
    tally: Option<Py<PyAny>>,
    tally_tokens: u64,
    last_token_at: f64,
}

#[pymethods]
impl PyStreamSession {
    #[new]
    #[pyo3(signature = (
        route, *, assemble, expose_token_ids, drop_usage, require_token_ids, prompt_tokens = 0,
        strip_reasoning = false, echo = false, model = None
    ))]
    #[allow(clippy::too_many_arguments)] // one per Python keyword argument
    fn new(
        route: &str,
        assemble: bool,
        expose_token_ids: bool,
        drop_usage: bool,
        require_token_ids: bool,
        prompt_tokens: u64,
        strip_reasoning: bool,
        echo: bool,
        model: Option<&str>,
    ) -> PyResult<Self> {
        let route: Route = route.parse().map_err(PyValueError::new_err)?;
        let mut inner = StreamSession::new(Options {
            route,
            assemble,
            expose_token_ids,
            drop_usage,
            require_token_ids,
            prompt_tokens,
            strip_reasoning,
            echo,
        });
        if let Some(name) = model {
            inner.rename_model(name);
        }
        Ok(PyStreamSession {
            inner,
            writer: None,
            tally: None,
            tally_tokens: 0,
            last_token_at: 0.0,
        })
    }

    /// Pump the engine body from a chunk boundary: output to `writer`, tokens to
    /// `tally.tokens` (added to its current value).
    #[pyo3(signature = (writer, tally = None))]
    fn start_pump(&mut self, writer: Py<PyAny>, tally: Option<Bound<'_, PyAny>>) -> PyResult<()> {
        self.tally_tokens = match &tally {
            Some(t) => t.getattr(intern!(t.py(), "tokens"))?.extract()?,
            None => 0,
        };
        self.tally = tally.map(Bound::unbind);
        self.writer = Some(writer);
        self.inner.start_pump();
        Ok(())
    }

    /// Stop writing and counting (the attempt left the fast path).
    fn stop_pump(&mut self) {
        self.writer = None;
        self.tally = None;
    }

    /// One raw read of the engine's chunked body; returns the pump flags (0: nothing to do).
    fn pump(&mut self, py: Python<'_>, data: &[u8]) -> PyResult<u32> {
        let pumped = self.inner.pump(data);
        let mut flags = pumped.flags;
        if pumped.tokens > 0 {
            self.last_token_at = monotonic();
            if let Some(t) = &self.tally {
                self.tally_tokens += pumped.tokens;
                t.bind(py)
                    .setattr(intern!(py, "tokens"), self.tally_tokens)?;
            }
        }
        if !pumped.write.is_empty() {
            if let Some(w) = &self.writer {
                if w.bind(py).call1((PyBytes::new(py, pumped.write),)).is_err() {
                    // A transport already closed: the client is gone, as its own loss says.
                    self.writer = None;
                    flags |= pump_flags::WRITE_FAILED;
                }
            }
        }
        Ok(flags)
    }

    /// The last read as `feed` returns it: (output, tokens, state).
    fn last_read<'py>(&self, py: Python<'py>) -> (Bound<'py, PyBytes>, u64, u8) {
        let (out, count, state) = self.inner.last_read();
        (PyBytes::new(py, out), count, state as u8)
    }

    /// Report the next pumped read that has tokens (flag 4), once.
    #[getter]
    fn watch_tokens(&self) -> bool {
        self.inner.watch_tokens
    }

    #[setter]
    fn set_watch_tokens(&mut self, on: bool) {
        self.inner.watch_tokens = on;
    }

    /// `time.monotonic()` of the last pumped read with tokens (0.0 before any).
    #[getter]
    fn last_token_at(&self) -> f64 {
        self.last_token_at
    }

    #[getter]
    fn framing_error(&self) -> Option<String> {
        self.inner.framing_error().map(ToString::to_string)
    }

    fn feed<'py>(&mut self, py: Python<'py>, data: &[u8]) -> (Bound<'py, PyBytes>, u64, u8) {
        let (out, count, state) = self.inner.feed(data);
        (PyBytes::new(py, out), count, state as u8)
    }

    fn finish<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        match self.inner.finish() {
            Ok(body) => Ok(PyBytes::new(py, &body)),
            Err(e) => Err(stream_error(py, &e)),
        }
    }

    /// Keep what resuming the answer on another engine needs; call before the first feed.
    fn enable_resume(&mut self) {
        self.inner.enable_resume();
    }

    /// (the continuation's token-ID prompt as a JSON list, generated IDs) or None.
    fn resume_point<'py>(&self, py: Python<'py>) -> Option<(Bound<'py, PyBytes>, u64)> {
        self.inner
            .resume_point()
            .map(|(prompt, n)| (PyBytes::new(py, &prompt), n))
    }

    /// Start reading the continuation engine's stream; False when the answer cannot resume.
    fn resume(&mut self) -> bool {
        self.inner.resume()
    }

    #[getter]
    fn failure(&self) -> Option<(&'static str, String)> {
        self.inner.failure().map(|e| (e.code(), e.to_string()))
    }

    #[getter]
    fn engine_error<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.inner.engine_error().map(|b| PyBytes::new(py, b))
    }

    #[getter]
    fn output_tokens(&self) -> u64 {
        self.inner.output_tokens()
    }

    #[getter]
    fn engine_usage_completion_tokens(&self) -> Option<u64> {
        self.inner.engine_usage_completion_tokens()
    }

    #[getter]
    fn engine_prompt_tokens(&self) -> Option<u64> {
        self.inner.engine_prompt_tokens()
    }

    #[getter]
    fn engine_cached_tokens(&self) -> Option<u64> {
        self.inner.engine_cached_tokens()
    }

    #[getter]
    fn events(&self) -> u64 {
        self.inner.events()
    }

    #[getter]
    fn started(&self) -> bool {
        self.inner.events() > 0
    }

    #[getter]
    fn state(&self) -> u8 {
        self.inner.state() as u8
    }
}

/// Add the stream classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let now: f64 = m
        .py()
        .import("time")?
        .call_method0("monotonic")?
        .extract()?;
    let _ = CLOCK.set((Instant::now(), now));
    m.add_class::<PyStreamSession>()?;
    m.add("StreamError", m.py().get_type::<StreamError>())?;
    Ok(())
}
