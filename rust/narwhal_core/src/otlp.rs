//! OTLP trace encoding: one finished request's spans (server span, sizing, admission wait,
//! placement, one client span per engine attempt) written straight to the protobuf wire
//! format of `opentelemetry.proto.trace.v1`, and the `ExportTraceServiceRequest` around a
//! batch of them. Only the fields Narwhal emits are written; the Python oracle is
//! `tests/reference/otlp_oracle.py` (byte for byte).

/// An attribute value (`opentelemetry.proto.common.v1.AnyValue`).
#[derive(Debug, Clone, PartialEq)]
pub enum AnyValue {
    Str(String),
    Bool(bool),
    Int(i64),
    Double(f64),
    Array(Vec<AnyValue>),
}

/// One engine attempt as the request's record holds it.
#[derive(Debug, Clone, Default)]
pub struct AttemptRecord<'a> {
    pub engine: &'a str,
    pub role: &'a str,
    pub host: &'a str,
    pub port: i64,
    pub span_id: u64,
    /// Monotonic nanoseconds; `end` 0: the attempt was never judged (the request's end).
    pub start: i64,
    pub end: i64,
    /// `ok`, `neutral`, a failure kind, or empty (never judged).
    pub outcome: &'a str,
}

/// What a finished request's spans are made of: its trace, its moments (monotonic
/// nanoseconds, 0 when the moment never came), and its figures.
#[derive(Debug, Clone, Default)]
pub struct RequestRecord<'a> {
    pub trace_id: u128,
    /// The client's span Narwhal's server span continues; 0 when Narwhal started the trace.
    pub parent_id: u64,
    pub span_id: u64,
    pub sampled: bool,
    /// Wall-clock nanoseconds minus monotonic nanoseconds, taken at arrival.
    pub offset: i64,
    pub start: i64,
    pub end: i64,
    pub parsed_at: i64,
    pub sized_at: i64,
    pub placed_at: i64,
    pub first_token_at: i64,
    pub model: Option<&'a str>,
    pub route: &'a str,
    pub path: &'a str,
    pub cls: &'a str,
    pub reason: Option<&'a str>,
    pub status: i64,
    pub request_id: &'a str,
    pub prompt_tokens: Option<i64>,
    pub output_tokens: i64,
    pub queue_wait_s: Option<f64>,
    pub placed_engines: Vec<&'a str>,
    pub attempts: Vec<AttemptRecord<'a>>,
}

const INTERNAL: u8 = 1;
const SERVER: u8 = 2;
const CLIENT: u8 = 3;

/// `gen_ai.operation.name` of a route (the OpenTelemetry GenAI semantic conventions).
fn operation(route: &str) -> &'static str {
    match route {
        "chat" => "chat",
        "completion" => "text_completion",
        _ => "",
    }
}

#[inline]
fn put_varint(out: &mut Vec<u8>, mut n: u64) {
    while n > 0x7F {
        out.push((n as u8 & 0x7F) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// A length-delimited field: `tag`, the length of what `body` writes, then it. One byte is
/// kept for the length; a body of 128 bytes or more moves along for the longer varint.
fn put_message(out: &mut Vec<u8>, tag: u8, body: impl FnOnce(&mut Vec<u8>)) {
    out.push(tag);
    out.push(0);
    let at = out.len();
    body(out);
    let len = out.len() - at;
    let extra = varint_len(len) - 1;
    if extra > 0 {
        out.resize(out.len() + extra, 0);
        out.copy_within(at..at + len, at + extra);
    }
    let mut n = len;
    for byte in &mut out[at - 1..at + extra] {
        *byte = (n as u8 & 0x7F) | 0x80;
        n >>= 7;
    }
    out[at + extra - 1] &= 0x7F;
}

#[inline]
fn put_bytes(out: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
    out.push(tag);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// The body of an `AnyValue` message.
fn put_any_value(out: &mut Vec<u8>, value: &AnyValue) {
    match value {
        AnyValue::Str(s) => put_bytes(out, 0x0A, s.as_bytes()),
        AnyValue::Bool(b) => out.extend_from_slice(&[0x10, u8::from(*b)]),
        AnyValue::Int(n) => {
            out.push(0x18);
            put_varint(out, *n as u64);
        }
        AnyValue::Double(d) => {
            out.push(0x21);
            out.extend_from_slice(&d.to_le_bytes());
        }
        AnyValue::Array(values) => put_message(out, 0x2A, |out| {
            for v in values {
                put_message(out, 0x0A, |out| put_any_value(out, v));
            }
        }),
    }
}

/// A `KeyValue` as the field `tag` of its parent (`Span.attributes` = 9, `Resource` = 1).
fn put_kv(out: &mut Vec<u8>, tag: u8, key: &str, value: &AnyValue) {
    put_message(out, tag, |out| {
        put_bytes(out, 0x0A, key.as_bytes());
        put_message(out, 0x12, |out| put_any_value(out, value));
    });
}

/// A `Span.attributes` entry whose value's body `value` writes.
fn attr_with(out: &mut Vec<u8>, key: &str, value: impl FnOnce(&mut Vec<u8>)) {
    put_message(out, 0x4A, |out| {
        put_bytes(out, 0x0A, key.as_bytes());
        put_message(out, 0x12, value);
    });
}

/// A short attribute: key and value body (`AnyValue` fields) under 128 bytes together, so
/// every length is one byte and written up front. False (nothing written) when it is longer.
#[inline]
fn attr_short(out: &mut Vec<u8>, key: &str, body: &[u8]) -> bool {
    let any = body.len();
    let kv = 2 + key.len() + 2 + any;
    if kv >= 0x80 {
        return false;
    }
    out.extend_from_slice(&[0x4A, kv as u8, 0x0A, key.len() as u8]);
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(&[0x12, any as u8]);
    out.extend_from_slice(body);
    true
}

fn attr_str(out: &mut Vec<u8>, key: &str, value: &str) {
    let value = value.as_bytes();
    let any = 2 + value.len(); // AnyValue.string_value = 1: tag, length, bytes
    let kv = 2 + key.len() + 2 + any;
    if kv < 0x80 {
        out.extend_from_slice(&[0x4A, kv as u8, 0x0A, key.len() as u8]);
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(&[0x12, any as u8, 0x0A, value.len() as u8]);
        out.extend_from_slice(value);
        return;
    }
    attr_with(out, key, |out| put_bytes(out, 0x0A, value));
}

fn attr_int(out: &mut Vec<u8>, key: &str, value: i64) {
    let mut body = [0x18u8; 11]; // AnyValue.int_value = 3, then a varint of at most 10
    let mut used = 1;
    let mut n = value as u64;
    while n > 0x7F {
        body[used] = (n as u8 & 0x7F) | 0x80;
        n >>= 7;
        used += 1;
    }
    body[used] = n as u8;
    let body = &body[..used + 1];
    if !attr_short(out, key, body) {
        attr_with(out, key, |out| out.extend_from_slice(body));
    }
}

fn attr_double(out: &mut Vec<u8>, key: &str, value: f64) {
    let mut body = [0x21u8; 9]; // AnyValue.double_value = 4
    body[1..].copy_from_slice(&value.to_le_bytes());
    if !attr_short(out, key, &body) {
        attr_with(out, key, |out| out.extend_from_slice(&body));
    }
}

/// An attribute whose value is an array of strings.
fn attr_strs<'a>(out: &mut Vec<u8>, key: &str, values: impl Iterator<Item = &'a str>) {
    attr_with(out, key, |out| {
        put_message(out, 0x2A, |out| {
            for value in values {
                put_message(out, 0x0A, |out| put_bytes(out, 0x0A, value.as_bytes()));
            }
        });
    });
}

/// One span as the encoder writes it (times in nanoseconds since the epoch).
struct Span<'a> {
    /// The name, in parts written one after the other (no string is built for it).
    name: [&'a str; 3],
    kind: u8,
    span_id: u64,
    parent_id: u64,
    start: i64,
    end: i64,
    event: Option<(&'a str, i64)>,
    error: Option<&'a str>,
    remote_parent: bool,
}

/// Writes one `Span` as a `ScopeSpans.spans` field; `attributes` writes its attributes.
fn put_span(
    out: &mut Vec<u8>,
    trace_id: &[u8; 16],
    sampled: bool,
    span: &Span<'_>,
    attributes: impl FnOnce(&mut Vec<u8>),
) {
    put_message(out, 0x12, |out| {
        put_bytes(out, 0x0A, trace_id);
        put_bytes(out, 0x12, &span.span_id.to_be_bytes());
        if span.parent_id != 0 {
            put_bytes(out, 0x22, &span.parent_id.to_be_bytes());
        }
        out.push(0x2A);
        put_varint(out, span.name.iter().map(|p| p.len() as u64).sum());
        for part in span.name {
            out.extend_from_slice(part.as_bytes());
        }
        out.extend_from_slice(&[0x30, span.kind, 0x39]);
        out.extend_from_slice(&(span.start as u64).to_le_bytes());
        out.push(0x41);
        out.extend_from_slice(&(span.end as u64).to_le_bytes());
        attributes(out);
        if let Some((name, at)) = span.event {
            put_message(out, 0x5A, |out| {
                out.push(0x09);
                out.extend_from_slice(&(at as u64).to_le_bytes());
                put_bytes(out, 0x12, name.as_bytes());
            });
        }
        if let Some(message) = span.error {
            put_message(out, 0x7A, |out| {
                if !message.is_empty() {
                    put_bytes(out, 0x12, message.as_bytes());
                }
                out.extend_from_slice(&[0x18, 0x02]); // STATUS_CODE_ERROR
            });
        }
        // flags: the W3C trace flags, and whether the parent is remote (known)
        let flags = u32::from(sampled) | 0x100 | if span.remote_parent { 0x200 } else { 0 };
        out.extend_from_slice(&[0x85, 0x01]);
        out.extend_from_slice(&flags.to_le_bytes());
    });
}

/// Spans to OTLP protobuf, for one resource and one instrumentation scope.
#[derive(Debug, Clone)]
pub struct Encoder {
    /// `ResourceSpans.resource` (field 1, whole).
    resource: Vec<u8>,
    /// `ScopeSpans.scope` (field 1, whole).
    scope: Vec<u8>,
}

impl Encoder {
    pub fn new(resource: &[(String, AnyValue)], scope: &str, version: &str) -> Self {
        let mut resource_field = Vec::new();
        put_message(&mut resource_field, 0x0A, |out| {
            for (key, value) in resource {
                put_kv(out, 0x0A, key, value); // Resource.attributes = 1
            }
        });
        let mut scope_field = Vec::new();
        put_message(&mut scope_field, 0x0A, |out| {
            put_bytes(out, 0x0A, scope.as_bytes()); // InstrumentationScope.name = 1
            put_bytes(out, 0x12, version.as_bytes()); // .version = 2
        });
        Encoder {
            resource: resource_field,
            scope: scope_field,
        }
    }

    /// The `ExportTraceServiceRequest` around `spans` ([`request_spans`] outputs, in order):
    /// `resource_spans = 1 { resource = 1, scope_spans = 2 { scope = 1, spans... } }`.
    pub fn request<S: AsRef<[u8]>>(&self, spans: &[S]) -> Vec<u8> {
        let spans_len: usize = spans.iter().map(|s| s.as_ref().len()).sum();
        let scope_spans = self.scope.len() + spans_len;
        let resource_spans = self.resource.len() + 1 + varint_len(scope_spans) + scope_spans;
        let mut out = Vec::with_capacity(resource_spans + 12);
        out.push(0x0A);
        put_varint(&mut out, resource_spans as u64);
        out.extend_from_slice(&self.resource);
        out.push(0x12);
        put_varint(&mut out, scope_spans as u64);
        out.extend_from_slice(&self.scope);
        for part in spans {
            out.extend_from_slice(part.as_ref());
        }
        out
    }
}

fn varint_len(n: usize) -> usize {
    let mut len = 1;
    let mut n = n >> 7;
    while n > 0 {
        len += 1;
        n >>= 7;
    }
    len
}

/// A finished request's spans, each a `ScopeSpans.spans` field, joined: children first
/// (sizing, admission wait, placement, attempts), the server span last. `ids` are the span
/// IDs of sizing, admission wait and placement (the others are the record's).
pub fn request_spans(r: &RequestRecord<'_>, ids: [u64; 3]) -> Vec<u8> {
    let mut out = Vec::with_capacity(2048 + 512 * r.attempts.len());
    let trace_id = r.trace_id.to_be_bytes();
    let sampled = r.sampled;
    let (off, end, root) = (r.offset, r.end, r.span_id);
    let or_end = |at: i64| if at != 0 { at } else { end };
    let op = operation(r.route);
    let name = match r.model {
        None => ["POST ", r.path, ""],
        Some(model) => [op, " ", model],
    };
    let gen_ai = |out: &mut Vec<u8>| {
        if let Some(model) = r.model {
            attr_str(out, "gen_ai.operation.name", op);
            attr_str(out, "gen_ai.request.model", model);
        }
    };
    let internal = |name, span_id, start: i64, stop: i64| Span {
        name: [name, "", ""],
        kind: INTERNAL,
        span_id,
        parent_id: root,
        start: start + off,
        end: stop + off,
        event: None,
        error: None,
        remote_parent: false,
    };
    let failed_class = matches!(r.cls, "failed" | "expired");
    let reason_or_class = match r.reason {
        Some(reason) if !reason.is_empty() => reason,
        _ => r.cls,
    };
    if r.parsed_at != 0 {
        let span = internal("narwhal.sizing", ids[0], r.parsed_at, or_end(r.sized_at));
        put_span(&mut out, &trace_id, sampled, &span, |out| {
            attr_int(
                out,
                "gen_ai.usage.input_tokens",
                r.prompt_tokens.unwrap_or(0),
            );
        });
    }
    if r.sized_at != 0 {
        let mut span = internal(
            "narwhal.admission_wait",
            ids[1],
            r.sized_at,
            or_end(r.placed_at),
        );
        if r.placed_at == 0 && failed_class {
            span.error = Some(reason_or_class);
        }
        put_span(&mut out, &trace_id, sampled, &span, |out| {
            if let Some(waited) = r.queue_wait_s {
                attr_double(out, "narwhal.queue_wait_s", waited);
            }
        });
    }
    if r.placed_at != 0 {
        let until = r.attempts.first().map_or(end, |a| a.start);
        let span = internal("narwhal.placement", ids[2], r.placed_at, until);
        put_span(&mut out, &trace_id, sampled, &span, |out| {
            if let Some(engine) = r.placed_engines.first() {
                attr_str(out, "narwhal.engine", engine);
            }
            if let Some(decode) = r.placed_engines.get(1) {
                attr_str(out, "narwhal.decode_engine", decode);
            }
        });
    }
    for (index, attempt) in r.attempts.iter().enumerate() {
        let outcome = if attempt.outcome.is_empty() {
            "unjudged"
        } else {
            attempt.outcome
        };
        let failed = !matches!(outcome, "ok" | "neutral");
        let span = Span {
            name: if r.model.is_some() {
                name
            } else {
                ["narwhal.attempt", "", ""]
            },
            kind: CLIENT,
            span_id: attempt.span_id,
            parent_id: root,
            start: attempt.start + off,
            end: or_end(attempt.end) + off,
            event: None,
            error: failed.then_some(outcome),
            remote_parent: false,
        };
        put_span(&mut out, &trace_id, sampled, &span, |out| {
            gen_ai(out);
            attr_str(out, "server.address", attempt.host);
            attr_int(out, "server.port", attempt.port);
            attr_str(out, "narwhal.engine", attempt.engine);
            attr_str(out, "narwhal.engine.role", attempt.role);
            attr_int(out, "narwhal.attempt", index as i64 + 1);
            attr_str(out, "narwhal.attempt.outcome", outcome);
            if failed {
                attr_str(out, "error.type", outcome);
            }
        });
    }
    let error = (failed_class || r.status >= 500).then_some(reason_or_class);
    let span = Span {
        name,
        kind: SERVER,
        span_id: root,
        parent_id: r.parent_id,
        start: r.start + off,
        end: end + off,
        event: (r.first_token_at != 0).then(|| ("first_token", r.first_token_at + off)),
        error,
        remote_parent: r.parent_id != 0,
    };
    put_span(&mut out, &trace_id, sampled, &span, |out| {
        gen_ai(out);
        attr_str(out, "http.request.method", "POST");
        attr_str(out, "http.route", r.path);
        attr_str(out, "narwhal.request_id", r.request_id);
        attr_str(out, "narwhal.outcome", r.cls);
        if r.status != 0 {
            attr_int(out, "http.response.status_code", r.status);
        }
        if let Some(reason) = r.reason {
            attr_str(out, "narwhal.reason", reason);
        }
        if let Some(error) = error {
            attr_str(out, "error.type", error);
        }
        if let Some(tokens) = r.prompt_tokens {
            attr_int(out, "gen_ai.usage.input_tokens", tokens);
        }
        if r.model.is_some() {
            attr_int(out, "gen_ai.usage.output_tokens", r.output_tokens);
        }
        if !r.attempts.is_empty() {
            let attempts = &r.attempts;
            let legs = (0..attempts.len())
                .filter(|&i| attempts[..i].iter().all(|a| a.role != attempts[i].role))
                .count();
            let engines = r.attempts.iter().map(|a| a.engine);
            attr_strs(out, "narwhal.engines", engines);
            let retries = (attempts.len() - legs) as i64;
            attr_int(out, "narwhal.retries", retries);
        } else if !r.placed_engines.is_empty() {
            attr_strs(out, "narwhal.engines", r.placed_engines.iter().copied());
        }
        if r.first_token_at != 0 {
            let ttft = (r.first_token_at - r.start) as f64 / 1e9;
            attr_double(out, "narwhal.ttft_s", ttft);
        }
    });
    out
}

/// Span IDs for a process: `draw` is a bijection of a counter (SplitMix64's finaliser)
/// from a random start, so the IDs are unique until 2^64 draws and look random (W3C asks
/// span IDs to be unique and random-looking; a draw of the OS's randomness per span costs
/// more than the rest of a span's encoding).
#[derive(Debug, Clone)]
pub struct SpanIds {
    counter: u64,
}

impl SpanIds {
    pub fn new(seed: u64) -> Self {
        SpanIds { counter: seed }
    }

    /// A new span ID (never 0, the invalid ID).
    pub fn draw(&mut self) -> u64 {
        loop {
            self.counter = self.counter.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.counter;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            if z != 0 {
                return z;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_lengths_past_one_byte() {
        let mut out = Vec::new();
        put_varint(&mut out, 300);
        assert_eq!(out, [0xAC, 0x02]);
        let mut long = Vec::new();
        put_message(&mut long, 0x0A, |o| o.extend_from_slice(&[7u8; 200]));
        assert_eq!(&long[..3], &[0x0A, 0xC8, 0x01]);
        assert_eq!(long.len(), 203);
    }

    #[test]
    fn negative_ints_are_twos_complement_varints_of_ten_bytes() {
        let mut out = Vec::new();
        put_any_value(&mut out, &AnyValue::Int(-3));
        assert_eq!(out.len(), 11);
        assert_eq!(out[0], 0x18);
        assert_eq!(out[10], 0x01);
    }

    #[test]
    fn the_request_wraps_resource_then_scope_spans() {
        let name = AnyValue::Str("n".into());
        let encoder = Encoder::new(&[("service.name".into(), name)], "s", "1");
        let spans = [0x12u8, 0x00].repeat(100);
        let request = encoder.request(&[&spans[..100], &spans[100..]]);
        // resource_spans = 1 { resource = 1 {...}, scope_spans = 2 {...} }, lengths of 2 bytes
        let mut expected = vec![0x0A];
        put_varint(&mut expected, (request.len() - 3) as u64);
        assert_eq!(&request[..3], &expected[..]);
        let resource = 2 + usize::from(request[4]);
        assert_eq!(request[3 + resource], 0x12);
        assert!(request.ends_with(&spans));
    }

    #[test]
    fn span_ids_are_distinct_and_never_zero() {
        let mut ids = SpanIds::new(0u64.wrapping_sub(0x9E37_79B9_7F4A_7C15));
        let drawn: Vec<u64> = (0..10_000).map(|_| ids.draw()).collect();
        let mut sorted = drawn.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), drawn.len());
        assert!(drawn.iter().all(|&id| id != 0));
    }

    #[test]
    fn a_refused_request_has_an_erroring_admission_wait_and_server_span() {
        let record = RequestRecord {
            trace_id: 1,
            span_id: 9,
            sampled: true,
            start: 10,
            end: 50,
            parsed_at: 20,
            sized_at: 30,
            model: Some("m"),
            route: "chat",
            path: "/v1/chat/completions",
            cls: "failed",
            reason: Some("queue_full"),
            status: 503,
            ..RequestRecord::default()
        };
        let spans = request_spans(&record, [1, 2, 3]);
        let errors = spans.windows(10).filter(|w| w == b"queue_full").count();
        // admission wait: status message; server: status message, reason and error.type
        assert_eq!(errors, 4);
        assert!(!spans.windows(17).any(|w| w == b"narwhal.placement"));
    }
}
