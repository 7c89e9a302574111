"""The ``tracing`` and ``logging`` sections: defaults, validation naming key and value, and the
router's JSON log lines."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from narwhal.config import ConfigError, Logging, Tracing, parse_config
from narwhal.observe.logs import JsonFormatter


def config(**sections: Any) -> dict[str, Any]:
    return {"model": "m", "engines": [{"name": "a0", "url": "http://10.0.0.5:8000"}],
            **sections}


def test_both_are_off_by_default() -> None:
    parsed = parse_config(config())
    assert parsed.tracing == Tracing(otlp_endpoint=None, service_name="narwhal",
                                     sample_ratio=1.0)
    assert parsed.logging == Logging(access_log=False, format="text", access_log_file=None)


def test_the_issue_example_parses() -> None:
    parsed = parse_config(config(
        tracing={"otlp_endpoint": "http://127.0.0.1:4318", "service_name": "narwhal",
                 "sample_ratio": 1.0},
        logging={"access_log": True, "format": "json", "access_log_file": "/var/log/a.log"}))
    assert parsed.tracing.otlp_endpoint == "http://127.0.0.1:4318"
    assert parsed.logging == Logging(access_log=True, format="json",
                                     access_log_file="/var/log/a.log")
    assert parse_config(config(tracing={"otlp_endpoint": "https://otel.example:4318/otlp",
                                        "sample_ratio": 0})).tracing.sample_ratio == 0.0


@pytest.mark.parametrize(("sections", "key", "text"), [
    ({"tracing": {"otlp_endpoint": "grpc://c:4317"}}, "tracing.otlp_endpoint",
     "must be http://host:port"),
    ({"tracing": {"otlp_endpoint": "http://:4318"}}, "tracing.otlp_endpoint",
     "must be http://host:port"),
    ({"tracing": {"otlp_endpoint": "http://c:99999"}}, "tracing.otlp_endpoint",
     "is not a valid URL"),
    ({"tracing": {"otlp_endpoint": "http://u:p@c:4318"}}, "tracing.otlp_endpoint",
     "no query or credentials"),
    ({"tracing": {"sample_ratio": 1.5}}, "tracing.sample_ratio", "a number from 0 to 1, got 1.5"),
    ({"tracing": {"service_name": ""}}, "tracing.service_name", "a non-empty string"),
    ({"logging": {"access_log": 1}}, "logging.access_log", "must be true or false, got 1"),
    ({"logging": {"access_log": "yes"}}, "logging.access_log", "true or false, got 'yes'"),
    ({"logging": {"format": "xml"}}, "logging.format", "one of 'text', 'json', got 'xml'"),
    ({"logging": {"acces_log": True}}, "logging.acces_log", "did you mean 'access_log'?"),
])
def test_bad_values_name_key_and_value(sections: dict[str, Any], key: str, text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(config(**sections), source="t.yaml")
    assert info.value.key == key
    assert text in str(info.value)


def test_json_log_lines() -> None:
    record = logging.LogRecord("narwhal.health", logging.WARNING, __file__, 1,
                               "engine %s: %s", ("e0", "unknown -> healthy"), None)
    record.created, record.msecs = 1_700_000_000.25, 250.0
    line = json.loads(JsonFormatter().format(record))
    assert line == {"time": "2023-11-14T22:13:20.250Z", "level": "warning",
                    "logger": "narwhal.health", "message": "engine e0: unknown -> healthy"}
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        failed = logging.LogRecord("narwhal", logging.ERROR, __file__, 1, "handler failed", (),
                                   sys.exc_info())
    out = json.loads(JsonFormatter().format(failed))
    assert out["level"] == "error" and "ValueError: boom" in out["exception"]
