"""The refusal table (SPEC §4) and error codes (SPEC §12) as data: status, type, counter."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

# Envelope `type` values (SPEC §12).
INVALID = "invalid_request_error"
CAPACITY = "capacity_error"
TIMEOUT = "timeout_error"
UPSTREAM = "upstream_error"
SERVER = "server_error"  # only for `internal_error`: a Narwhal bug, never an expected answer

# Terminal counter classes (SPEC §5).
REJECTED = "rejected"
REFUSED = "refused"
INVALID_REQUESTS = "invalid_requests"
EXPIRED = "expired"
FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the refusal table: everything the HTTP answer and the counters need."""

    code: str  # error.code in the envelope, and the `reason` label of the counter
    status: int
    type: str  # invalid_request_error | capacity_error | timeout_error | upstream_error
    counter: str | None  # terminal class counted, or None for non-completion traffic
    retry_after: int | None  # default Retry-After seconds; None: the answer never carries one
    message: str  # default message
    headers: tuple[tuple[bytes, bytes], ...] = ()  # fixed extra headers (e.g. WWW-Authenticate)


_RETRY = "; retry shortly."

_ROWS: tuple[Row, ...] = (
    # -- the request itself (400/404/413), counted invalid_requests --------------------------
    Row("invalid_json", 400, INVALID, INVALID_REQUESTS, None,
        "The request body is not valid JSON."),
    Row("invalid_request", 400, INVALID, INVALID_REQUESTS, None,
        "The request body is not a valid request."),
    Row("model_not_found", 404, INVALID, INVALID_REQUESTS, None,
        "The requested model does not exist."),
    Row("invalid_sampling_width", 400, INVALID, INVALID_REQUESTS, None,
        "Invalid sampling width: this router serves n = 1 and best_of = 1 only."),
    Row("unsupported_option", 400, INVALID, INVALID_REQUESTS, None,
        "This option is not supported for non-streaming requests."),
    Row("request_too_large", 413, INVALID, INVALID_REQUESTS, None,
        "The request body exceeds the configured size limit (serving.max_request_bytes)."),
    # -- capacity (429/503), counted rejected ------------------------------------------------
    Row("retention_full", 429, CAPACITY, REJECTED, 1,
        "Too many requests are in flight" + _RETRY),
    Row("queue_full", 429, CAPACITY, REJECTED, 1,
        "The admission queue is full" + _RETRY),
    Row("backend_unavailable", 503, CAPACITY, REJECTED, 1,
        "No engine is available to serve this request" + _RETRY),
    Row("router_standby", 503, CAPACITY, REJECTED, 1,
        "This router is on standby" + _RETRY),
    Row("router_fenced", 503, CAPACITY, REJECTED, 1,
        "This router has lost its lease (fenced)" + _RETRY),
    Row("maintenance", 503, CAPACITY, REJECTED, 1,
        "The fleet is under maintenance" + _RETRY),
    Row("monitoring_degraded", 503, CAPACITY, REJECTED, 1,
        "Engine monitoring is degraded" + _RETRY),
    # -- predictive admission (429), counted refused -----------------------------------------
    # Retry-After is the budget overrun (see `retry_after_for_overrun`); 1 is only the floor.
    Row("ttft_budget_exceeded", 429, CAPACITY, REFUSED, 1,
        "The projected time to first token exceeds the TTFT budget; retry later."),
    Row("prompt_exceeds_ttft_budget", 429, CAPACITY, REFUSED, None,
        "The prompt alone exceeds the time-to-first-token budget, so retrying cannot help: "
        "shorten the prompt or raise the target (admission.ttft_budget_s)."),
    # -- expiry before response headers (504), counted expired -------------------------------
    Row("admission_wait_expired", 504, TIMEOUT, EXPIRED, None,
        "Terminal expiry: the request waited longer than the admission wait allows."),
    Row("deadline_expired", 504, TIMEOUT, EXPIRED, None,
        "Terminal expiry: the request deadline passed before the response started."),
    # -- engine failures (502), counted failed -----------------------------------------------
    Row("engine_error", 502, UPSTREAM, FAILED, None,
        "The engine failed to serve the request."),
    Row("unsupported_engine_field", 502, UPSTREAM, FAILED, None,
        "The engine returned a field this router cannot assemble."),
    Row("malformed_engine_output", 502, UPSTREAM, FAILED, None,
        "The engine returned malformed output."),
    Row("internal_error", 500, SERVER, FAILED, None,
        "The router failed while serving the request."),
    # -- routes and the HTTP layer: not completion traffic, not counted ----------------------
    Row("not_found", 404, INVALID, None, None, "Not found."),
    Row("method_not_allowed", 405, INVALID, None, None, "Method not allowed."),
    Row("unauthorized", 401, INVALID, None, None,
        "A valid bearer token is required.", ((b"WWW-Authenticate", b"Bearer"),)),
    Row("header_too_large", 431, INVALID, None, None,
        "The request headers exceed the configured limit (serving.max_header_bytes)."),
    Row("bad_request", 400, INVALID, None, None, "Malformed HTTP request."),
    Row("conflict", 409, INVALID, None, None,
        "The request conflicts with the router's state (e.g. a lease backend decides the role)."),
)

ROWS: Mapping[str, Row] = MappingProxyType({row.code: row for row in _ROWS})
"""Every error code Narwhal answers with, keyed by code."""

COUNTER_REASONS: Mapping[str, str] = MappingProxyType(
    {row.code: row.counter for row in _ROWS if row.counter is not None}
    | {"engine_rejected": INVALID_REQUESTS}  # the engine's own 4xx passes through unchanged
)
"""Every `reason` label value, with the terminal counter class it belongs to (bounded set)."""

READY_REASONS: Mapping[str, str] = MappingProxyType({
    "router_standby": "standby",
    "router_fenced": "fenced",
    "maintenance": "maintenance",
    "monitoring_degraded": "monitoring_degraded",
    "backend_unavailable": "no_eligible_engines",
})
"""Router-state refusal code → the reason `/ready` reports for the same state (SPEC §3)."""


def retry_after_for_overrun(overrun_s: float) -> int:
    """Retry-After for `ttft_budget_exceeded`: the overrun in whole seconds, half up, at least 1."""
    if not overrun_s < 86_400.0:  # also catches NaN and infinity
        return 86_400
    return max(1, int(overrun_s + 0.5))
