//! Python binding of the OTLP span encoder (`SpanEncoder`): reads a finished request's
//! `Observation` (its attributes, by name) into the core's record, and converts only.

use narwhal_core::otlp::{request_spans, AnyValue, AttemptRecord, Encoder, RequestRecord, SpanIds};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::pybacked::{PyBackedBytes, PyBackedStr};
use pyo3::types::{PyBool, PyBytes, PyFloat, PyInt, PyString};

#[derive(FromPyObject)]
struct Trace {
    #[pyo3(from_py_with = trace_id)]
    trace_id: u128,
    parent_id: u64,
    span_id: u64,
    sampled: bool,
}

/// A 128-bit trace ID through `int.to_bytes` (PyO3's `u128` under abi3 costs ~2 µs).
fn trace_id(value: &Bound<'_, PyAny>) -> PyResult<u128> {
    let bytes = value.call_method1(pyo3::intern!(value.py(), "to_bytes"), (16, "big"))?;
    let bytes: [u8; 16] = bytes.extract()?;
    Ok(u128::from_be_bytes(bytes))
}

#[derive(FromPyObject)]
struct Engine {
    name: PyBackedStr,
    role: PyBackedStr,
}

#[derive(FromPyObject)]
struct Attempt {
    engine: Engine,
    host: PyBackedStr,
    port: i64,
    span_id: u64,
    start: i64,
    end: i64,
    outcome: PyBackedStr,
}

/// The attributes of `narwhal.observe.observation.Observation` the spans are made of
/// (strings borrowed, not copied).
#[derive(FromPyObject)]
struct Observation {
    trace: Trace,
    offset: i64,
    start: i64,
    end: i64,
    parsed_at: i64,
    sized_at: i64,
    placed_at: i64,
    first_token_at: i64,
    model: Option<PyBackedStr>,
    route: PyBackedStr,
    path: PyBackedStr,
    cls: PyBackedStr,
    reason: Option<PyBackedStr>,
    status: i64,
    request_id: PyBackedStr,
    prompt_tokens: Option<i64>,
    output_tokens: i64,
    queue_wait_s: Option<f64>,
    placed_engines: Vec<PyBackedStr>,
    attempts: Vec<Attempt>,
}

impl Observation {
    fn record(&self) -> RequestRecord<'_> {
        RequestRecord {
            trace_id: self.trace.trace_id,
            parent_id: self.trace.parent_id,
            span_id: self.trace.span_id,
            sampled: self.trace.sampled,
            offset: self.offset,
            start: self.start,
            end: self.end,
            parsed_at: self.parsed_at,
            sized_at: self.sized_at,
            placed_at: self.placed_at,
            first_token_at: self.first_token_at,
            model: self.model.as_deref(),
            route: &self.route,
            path: &self.path,
            cls: &self.cls,
            reason: self.reason.as_deref(),
            status: self.status,
            request_id: &self.request_id,
            prompt_tokens: self.prompt_tokens,
            output_tokens: self.output_tokens,
            queue_wait_s: self.queue_wait_s,
            placed_engines: self.placed_engines.iter().map(|e| &**e).collect(),
            attempts: self
                .attempts
                .iter()
                .map(|a| AttemptRecord {
                    engine: &a.engine.name,
                    role: &a.engine.role,
                    host: &a.host,
                    port: a.port,
                    span_id: a.span_id,
                    start: a.start,
                    end: a.end,
                    outcome: &a.outcome,
                })
                .collect(),
        }
    }
}

/// A resource attribute's value: str, bool, int, float, or a sequence of those.
fn any_value(value: &Bound<'_, PyAny>) -> PyResult<AnyValue> {
    if value.is_instance_of::<PyBool>() {
        return Ok(AnyValue::Bool(value.extract()?));
    }
    if value.is_instance_of::<PyInt>() {
        return Ok(AnyValue::Int(value.extract()?));
    }
    if value.is_instance_of::<PyFloat>() {
        return Ok(AnyValue::Double(value.extract()?));
    }
    if value.is_instance_of::<PyString>() {
        return Ok(AnyValue::Str(value.extract()?));
    }
    match value.try_iter() {
        Ok(items) => Ok(AnyValue::Array(
            items
                .map(|item| any_value(&item?))
                .collect::<PyResult<_>>()?,
        )),
        Err(_) => Err(PyTypeError::new_err(format!(
            "an attribute value must be str, bool, int, float or a sequence of them, not {}",
            value.get_type().name()?
        ))),
    }
}

/// Finished requests' spans to OTLP protobuf, for one resource and instrumentation scope.
#[pyclass(module = "narwhal._narwhal_fast", name = "SpanEncoder")]
pub struct PySpanEncoder {
    encoder: Encoder,
    ids: SpanIds,
}

#[pymethods]
impl PySpanEncoder {
    #[new]
    #[pyo3(signature = (resource, scope, version, *, seed))]
    fn new(
        resource: Vec<(String, Bound<'_, PyAny>)>,
        scope: &str,
        version: &str,
        seed: u64,
    ) -> PyResult<Self> {
        let resource = resource
            .iter()
            .map(|(key, value)| Ok((key.clone(), any_value(value)?)))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(PySpanEncoder {
            encoder: Encoder::new(&resource, scope, version),
            ids: SpanIds::new(seed),
        })
    }

    /// A finished `Observation`'s spans (`ScopeSpans.spans` fields, joined).
    fn encode<'py>(
        &mut self,
        py: Python<'py>,
        observation: Observation,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let ids = [self.ids.draw(), self.ids.draw(), self.ids.draw()];
        let spans = request_spans(&observation.record(), ids);
        Ok(PyBytes::new(py, &spans))
    }

    /// The `ExportTraceServiceRequest` around `spans` (``encode`` outputs).
    fn request<'py>(&self, py: Python<'py>, spans: Vec<PyBackedBytes>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.encoder.request(&spans))
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySpanEncoder>()?;
    Ok(())
}
