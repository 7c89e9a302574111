//! Python binding of the stream core (`StreamSession`, `StreamError`): converts only.

use narwhal_core::error::StreamError as CoreError;
use narwhal_core::session::{Options, Route, StreamSession};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

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
        Ok(PyStreamSession { inner })
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
    m.add_class::<PyStreamSession>()?;
    m.add("StreamError", m.py().get_type::<StreamError>())?;
    Ok(())
}
