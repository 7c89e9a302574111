"""vLLM's error shapes: the nested JSON error body and the mid-stream error event."""

from __future__ import annotations

import json

import orjson


class SimError(Exception):
    """A request the simulated engine refuses, as vLLM would (status == body code)."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> bytes:
        return error_body(self.status, self.message, self.err_type, self.param)


def error_body(status: int, message: str, err_type: str, param: str | None = None) -> bytes:
    """``{"error":{"message":..,"type":..,"param":..,"code":N}}``, compact (Starlette)."""
    return orjson.dumps(
        {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    )


def error_event(status: int = 500, message: str = "Internal server error",
                err_type: str = "InternalServerError") -> bytes:
    """The mid-stream error event: Python ``json.dumps`` spacing, as vLLM writes it."""
    payload = {"error": {"message": message, "type": err_type, "param": None, "code": status}}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def not_found_model(model: str) -> SimError:
    return SimError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")


def internal() -> SimError:
    return SimError(500, "Internal server error", "InternalServerError")


def context_too_long(max_model_len: int, prompt_tokens: int, max_tokens: int | None) -> SimError:
    """vLLM's 400 for a prompt (plus max_tokens) over the context window."""
    if max_tokens is None or prompt_tokens >= max_model_len:
        return SimError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"request has {prompt_tokens} input tokens. Please reduce the length of the input "
            "messages.",
        )
    return SimError(
        400,
        f"This model's maximum context length is {max_model_len} tokens. However, you "
        f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
        f"{max_tokens} in the completion). Please reduce the length of the messages or "
        "completion.",
    )


def bad_request(message: str, param: str | None = None) -> SimError:
    return SimError(400, message, "BadRequestError", param)
