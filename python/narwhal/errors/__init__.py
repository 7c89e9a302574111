"""Typed failures: a Refusal names its table row; server/responses.py turns it into HTTP."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from narwhal.errors.table import ROWS, Row


class Refusal(Exception):
    """A request Narwhal will not (or can no longer) serve; carries all the HTTP answer needs."""

    __slots__ = ("code", "headers", "message", "param", "retry_after", "row")

    code: str
    message: str
    param: str | None
    retry_after: int | None  # effective Retry-After: the caller's value, else the row's default
    headers: tuple[tuple[bytes, bytes], ...]  # extra headers beyond the row's (e.g. Allow)
    row: Row

    def __init__(
        self,
        code: str,
        message: str | None = None,
        *,
        param: str | None = None,
        retry_after: int | None = None,
        headers: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        row = ROWS.get(code)
        if row is None:
            raise ValueError(f"unknown error code {code!r}")
        if retry_after is not None:
            if row.retry_after is None:
                raise ValueError(f"{code} answers never carry Retry-After")
            if type(retry_after) is not int or retry_after < 1:
                raise ValueError(f"Retry-After must be a whole number of seconds >= 1, "
                                 f"got {retry_after!r}")
        msg = row.message if message is None else message
        super().__init__(code, msg)
        self.code = code
        self.message = msg
        self.param = param
        self.retry_after = row.retry_after if retry_after is None else retry_after
        self.headers = tuple(headers)
        self.row = row

    @property
    def status(self) -> int:
        """The HTTP status of this refusal (from its row)."""
        return self.row.status

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __repr__(self) -> str:
        return (f"Refusal({self.code!r}, {self.message!r}, param={self.param!r}, "
                f"retry_after={self.retry_after!r})")

    def __reduce__(self) -> tuple[Any, ...]:
        kwargs = {"param": self.param, "headers": self.headers,
                  "retry_after": None if self.retry_after == self.row.retry_after
                  else self.retry_after}
        return (_rebuild, (self.code, self.message, kwargs))


def _rebuild(code: str, message: str, kwargs: dict[str, Any]) -> Refusal:
    return Refusal(code, message, **kwargs)
