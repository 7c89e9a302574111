//! Python binding of the OTLP span encoder (`SpanEncoder`): reads a finished request's
//! record (`Observation.span_record()`, a tuple) into the core's, and converts only.

use narwhal_core::otlp::{request_spans, AnyValue, AttemptRecord, Encoder, RequestRecord, SpanIds};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::pybacked::{PyBackedBytes, PyBackedStr};
use pyo3::types::{PyBool, PyBytes, PyFloat, PyInt, PyString};

/// One engine attempt: `(engine, role, host, port, span_id, start, end, outcome)`.
#[derive(FromPyObject)]
struct Attempt(
    PyBackedStr,
    PyBackedStr,
    PyBackedStr,
    i64,
    u64,
    i64,
    i64,
    PyBackedStr,
);

/// A finished request as `Observation.span_record()` gives it (strings borrowed, not copied):
/// `(trace, moments, texts, figures, placed_engines, attempts)` where `trace` is the trace
/// ID's high and low 64 bits, the parent and server span IDs and sampled; `moments` the clock
/// offset, start, end, parsed, sized, placed and first token; `texts` the model, route, path,
/// outcome class, reason and request ID; `figures` the status, prompt and output tokens and
/// the queue wait.
#[derive(FromPyObject)]
struct Record(
    (u64, u64, u64, u64, bool),
    [i64; 7],
    Texts,
    (i64, Option<i64>, i64, Option<f64>),
    Vec<PyBackedStr>,
    Vec<Attempt>,
);

#[derive(FromPyObject)]
struct Texts(
    Option<PyBackedStr>,
    PyBackedStr,
    PyBackedStr,
    PyBackedStr,
    Option<PyBackedStr>,
    PyBackedStr,
);

impl Record {
    fn record(&self) -> RequestRecord<'_> {
        let (high, low, parent_id, span_id, sampled) = self.0;
        let [offset, start, end, parsed_at, sized_at, placed_at, first_token_at] = self.1;
        let Texts(model, route, path, cls, reason, request_id) = &self.2;
        let (status, prompt_tokens, output_tokens, queue_wait_s) = self.3;
        RequestRecord {
            trace_id: u128::from(high) << 64 | u128::from(low),
            parent_id,
            span_id,
            sampled,
            offset,
            start,
            end,
            parsed_at,
            sized_at,
            placed_at,
            first_token_at,
            model: model.as_deref(),
            route,
            path,
            cls,
            reason: reason.as_deref(),
            status,
            request_id,
            prompt_tokens,
            output_tokens,
            queue_wait_s,
            placed_engines: self.4.iter().map(|e| &**e).collect(),
            attempts: self
                .5
                .iter()
                .map(|a| AttemptRecord {
                    engine: &a.0,
                    role: &a.1,
                    host: &a.2,
                    port: a.3,
                    span_id: a.4,
                    start: a.5,
                    end: a.6,
                    outcome: &a.7,
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

    /// A finished request's spans (`ScopeSpans.spans` fields, joined) from its
    /// `Observation.span_record()`.
    fn encode<'py>(&mut self, py: Python<'py>, record: Record) -> Bound<'py, PyBytes> {
        let ids = [self.ids.draw(), self.ids.draw(), self.ids.draw()];
        PyBytes::new(py, &request_spans(&record.record(), ids))
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
