"""Refusals, the refusal table and their HTTP form (errors.py, admission/table.py, responses.py)."""

from __future__ import annotations

import json
import pickle

import orjson
import pytest

from narwhal.errors import Refusal
from narwhal.errors.table import (
    COUNTER_REASONS,
    READY_REASONS,
    ROWS,
    retry_after_for_overrun,
)
from narwhal.server.responses import (
    STATUS_LINES,
    error_body,
    midstream_error_event,
    refusal_response,
    status_line,
)

# SPEC §12's error codes: code → (status, type, counter class, Retry-After by default).
SPEC_CODES = {
    "invalid_json": (400, "invalid_request_error", "invalid_requests", None),
    "invalid_request": (400, "invalid_request_error", "invalid_requests", None),
    "model_not_found": (404, "invalid_request_error", "invalid_requests", None),
    "invalid_sampling_width": (400, "invalid_request_error", "invalid_requests", None),
    "unsupported_option": (400, "invalid_request_error", "invalid_requests", None),
    "request_too_large": (413, "invalid_request_error", "invalid_requests", None),
    "retention_full": (429, "capacity_error", "rejected", 1),
    "queue_full": (429, "capacity_error", "rejected", 1),
    "admission_wait_expired": (504, "timeout_error", "expired", None),
    "deadline_expired": (504, "timeout_error", "expired", None),
    "ttft_budget_exceeded": (429, "capacity_error", "refused", 1),
    "prompt_exceeds_ttft_budget": (429, "capacity_error", "refused", None),
    "backend_unavailable": (503, "capacity_error", "rejected", 1),
    "router_standby": (503, "capacity_error", "rejected", 1),
    "router_fenced": (503, "capacity_error", "rejected", 1),
    "maintenance": (503, "capacity_error", "rejected", 1),
    "monitoring_degraded": (503, "capacity_error", "rejected", 1),
    "engine_error": (502, "upstream_error", "failed", None),
    "unsupported_engine_field": (502, "upstream_error", "failed", None),
    "malformed_engine_output": (502, "upstream_error", "failed", None),
}
UNCOUNTED = {
    "not_found": 404, "method_not_allowed": 405, "unauthorized": 401,
    "header_too_large": 431, "bad_request": 400,
}


@pytest.mark.parametrize("code", sorted(SPEC_CODES))
def test_spec_code_row(code: str) -> None:
    status, type_, counter, retry_after = SPEC_CODES[code]
    row = ROWS[code]
    assert (row.code, row.status, row.type, row.counter, row.retry_after) == (
        code, status, type_, counter, retry_after)
    assert COUNTER_REASONS[code] == counter


@pytest.mark.parametrize("code", sorted(SPEC_CODES))
def test_spec_code_http_form(code: str) -> None:
    status, type_, _, retry_after = SPEC_CODES[code]
    ref = Refusal(code)
    got_status, headers, body = refusal_response(ref)
    assert got_status == status == ref.status
    expected_headers = [] if retry_after is None else [(b"Retry-After", b"1")]
    assert headers == expected_headers
    envelope = orjson.loads(body)
    assert envelope == {"error": {"message": ROWS[code].message, "type": type_,
                                  "param": None, "code": code}}
    assert list(envelope["error"]) == ["message", "type", "param", "code"]
    assert b" " not in body.split(b'"message":')[0]  # compact JSON


@pytest.mark.parametrize(("code", "status"), sorted(UNCOUNTED.items()))
def test_uncounted_rows(code: str, status: int) -> None:
    row = ROWS[code]
    assert (row.status, row.type, row.counter, row.retry_after) == (
        status, "invalid_request_error", None, None)
    assert code not in COUNTER_REASONS


def test_every_row_is_consistent() -> None:
    for code, row in ROWS.items():
        assert row.code == code and row.message
        assert row.status in STATUS_LINES
        if row.retry_after is not None:
            assert row.status in (429, 503)


def test_counter_reasons_include_engine_rejected() -> None:
    assert COUNTER_REASONS["engine_rejected"] == "invalid_requests"
    assert "engine_rejected" not in ROWS  # the engine's own body passes through


def test_ready_reasons_name_router_states() -> None:
    assert set(READY_REASONS.values()) <= {
        "standby", "fenced", "maintenance", "monitoring_degraded", "no_eligible_engines"}
    assert all(ROWS[code].status == 503 for code in READY_REASONS)


def test_messages_required_by_the_table() -> None:
    assert "Invalid sampling width" in ROWS["invalid_sampling_width"].message
    assert ROWS["admission_wait_expired"].message.startswith("Terminal expiry")
    assert ROWS["deadline_expired"].message.startswith("Terminal expiry")
    msg = ROWS["prompt_exceeds_ttft_budget"].message
    assert "shorten the prompt" in msg and "raise the target" in msg


def test_unknown_code_is_value_error() -> None:
    with pytest.raises(ValueError, match="unknown error code"):
        Refusal("nope")
    with pytest.raises(ValueError):
        Refusal("engine_rejected")


def test_refusal_fields_and_defaults() -> None:
    ref = Refusal("invalid_request", "bad thing", param="messages[1].role")
    assert (ref.code, ref.message, ref.param, ref.retry_after) == (
        "invalid_request", "bad thing", "messages[1].role", None)
    assert ref.row is ROWS["invalid_request"]
    assert isinstance(ref, Exception)
    assert "bad thing" in str(ref) and "invalid_request" in repr(ref)
    assert Refusal("queue_full").message == ROWS["queue_full"].message


def test_retry_after_override() -> None:
    ref = Refusal("ttft_budget_exceeded", retry_after=7)
    assert ref.retry_after == 7
    status, headers, _ = refusal_response(ref)
    assert status == 429 and headers == [(b"Retry-After", b"7")]
    assert refusal_response(Refusal("backend_unavailable", retry_after=3))[1] == [
        (b"Retry-After", b"3")]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_retry_after_must_be_whole_seconds(bad: object) -> None:
    with pytest.raises(ValueError):
        Refusal("queue_full", retry_after=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("code", ["prompt_exceeds_ttft_budget", "invalid_json", "engine_error"])
def test_rows_without_retry_after_refuse_one(code: str) -> None:
    with pytest.raises(ValueError):
        Refusal(code, retry_after=2)


@pytest.mark.parametrize(
    ("overrun", "expected"),
    [(0.0, 1), (0.2, 1), (0.5, 1), (1.49, 1), (1.5, 2), (2.5, 3), (3.2, 3), (-4.0, 1),
     (float("inf"), 86_400), (float("nan"), 86_400)],
)
def test_retry_after_for_overrun(overrun: float, expected: int) -> None:
    assert retry_after_for_overrun(overrun) == expected


def test_param_and_custom_message_in_body() -> None:
    ref = Refusal("invalid_request", "`stream` must be a boolean.", param="stream")
    _, _, body = refusal_response(ref)
    assert orjson.loads(body)["error"] == {
        "message": "`stream` must be a boolean.", "type": "invalid_request_error",
        "param": "stream", "code": "invalid_request"}


def test_extra_headers() -> None:
    status, headers, _ = refusal_response(Refusal("unauthorized"))
    assert status == 401 and headers == [(b"WWW-Authenticate", b"Bearer")]
    allow = (b"Allow", b"POST")
    assert refusal_response(Refusal("method_not_allowed", headers=[allow]))[1] == [allow]


def test_error_body_is_compact_and_keeps_unicode() -> None:
    body = error_body("naïve ☃", "t", None, None)
    assert body == '{"error":{"message":"naïve ☃","type":"t","param":null,"code":null}}'.encode()


def test_a_handler_bug_is_a_500_that_leaks_nothing() -> None:
    status, headers, body = refusal_response(Refusal("internal_error"))
    assert status == 500 and headers == []
    error = orjson.loads(body)["error"]
    assert (error["code"], error["type"]) == ("internal_error", "server_error")


def test_midstream_event_exact_bytes() -> None:
    assert midstream_error_event("m", "t", 500) == (
        b'data: {"error": {"message": "m", "type": "t", "param": null, "code": 500}}\n\n'
        b"data: [DONE]\n\n")


def test_midstream_event_from_refusal() -> None:
    got = midstream_error_event(Refusal("deadline_expired"))
    first, done = got.split(b"\n\n", 1)
    assert done == b"data: [DONE]\n\n"
    assert first.startswith(b'data: {"error": {"message": "Terminal expiry')
    payload = json.loads(first[len(b"data: "):])
    assert payload == {"error": {"message": ROWS["deadline_expired"].message,
                                 "type": "timeout_error", "param": None, "code": 504}}


def test_midstream_event_matches_python_json_dumps() -> None:
    msg = 'quote " backslash \\ newline \n snow ☃'
    got = midstream_error_event(msg, "upstream_error", 502)
    want = json.dumps({"error": {"message": msg, "type": "upstream_error", "param": None,
                                 "code": 502}})
    assert got == b"data: " + want.encode() + b"\n\ndata: [DONE]\n\n"
    assert b"\\u2603" in got  # ASCII escapes, as vLLM's json.dumps writes them


def test_midstream_str_needs_type_and_code() -> None:
    with pytest.raises(TypeError):
        midstream_error_event("m")  # type: ignore[call-overload]


def test_status_lines() -> None:
    assert STATUS_LINES[200] == b"HTTP/1.1 200 OK\r\n"
    assert STATUS_LINES[429] == b"HTTP/1.1 429 Too Many Requests\r\n"
    assert STATUS_LINES[431] == b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    assert STATUS_LINES[504] == b"HTTP/1.1 504 Gateway Timeout\r\n"
    for row in ROWS.values():
        assert status_line(row.status) == STATUS_LINES[row.status]
    assert status_line(499) == b"HTTP/1.1 499 \r\n"
    with pytest.raises(ValueError):
        status_line(42)


def test_refusal_pickles() -> None:
    ref = Refusal("ttft_budget_exceeded", "late", param=None, retry_after=4)
    back = pickle.loads(pickle.dumps(ref))
    assert (back.code, back.message, back.retry_after) == ("ttft_budget_exceeded", "late", 4)
