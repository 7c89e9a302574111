"""The router's own log lines: ``text`` (time, logger, message) or ``json`` (one object per
line), chosen by ``logging.format`` or ``narwhal serve --log-format``."""

from __future__ import annotations

import logging
import sys
import time

import orjson

TEXT_FORMAT = "%(asctime)s %(name)s %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (ISO 8601 UTC), ``level``, ``logger``,
    ``message``, and ``exception`` when the record carries one."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        out: dict[str, object] = {
            "time": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(out).decode()


def setup_logging(level: str, fmt: str) -> None:
    """Configure the root logger once for the process: to stderr, in ``fmt``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
