"""Per-request scenario and fault directives: ``X-Sim-Scenario``, ``X-Sim-Fault``, prompt markers.

Headers: ``X-Sim-Scenario: reasoning,tool_calls`` and ``X-Sim-Fault: name[:arg]``.
The same directives may sit anywhere in the request body as ``[[sim:reasoning]]`` or
``[[fault:reset_mid_stream:3]]`` for clients that cannot set headers. Unknown names are
errors, so a typo in a test fails loudly instead of silently running the happy path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SCENARIOS = frozenset({
    "reasoning", "reasoning_content", "tool_calls", "interleaved_tools", "refusal",
    "function_call", "id_only_events", "multi_token",
})

# Fault name -> default argument (None: takes no argument). Arguments count generated
# tokens (0 = right after the response headers), except slow_headers (milliseconds).
FAULTS: dict[str, int | None] = {
    # token_ids of every event from token N on: key absent, null, [true], [-id-1], [id.0], ["id"]
    "missing_ids": 0, "null_ids": 0, "bool_ids": 0, "negative_ids": 0, "float_ids": 0,
    "string_ids": 0,
    # after token N: a cut-off JSON event / lines that are not SSE / a broken HTTP chunk + close
    "malformed_json": 1, "bad_sse": 1, "bad_chunk": 1,
    # a delta carrying a field Narwhal does not support, inserted at token position N
    "audio": 0, "annotations": 0, "custom_tool": 0,
    # vLLM's error bodies instead of the response
    "http_500": None, "http_400": None,
    # before any header: TCP reset / silence / headers N ms late
    "reset_before_headers": None, "hang_before_headers": None, "slow_headers": 1000,
    # after token N: TCP reset / silence / vLLM's mid-stream error event and [DONE] /
    # the body ended cleanly without [DONE] (an engine process stopped mid-answer)
    "reset_mid_stream": 1, "hang_mid_stream": 1, "error_event": 1, "close_mid_stream": 1,
}
ID_FAULTS = frozenset({"missing_ids", "null_ids", "bool_ids", "negative_ids", "float_ids",
                       "string_ids"})
PAYLOAD_FAULTS = frozenset({"audio", "annotations", "custom_tool"})
# Faults that act when the request has produced ``arg`` tokens.
TRIGGER_FAULTS = frozenset({"malformed_json", "bad_sse", "bad_chunk", "reset_mid_stream",
                            "hang_mid_stream", "error_event", "close_mid_stream"})

_MARKER = re.compile(rb"\[\[(sim|fault):([A-Za-z_][A-Za-z_0-9]*(?:[,:][A-Za-z_0-9]+)*)\]\]")


@dataclass(frozen=True)
class Fault:
    """One injected fault and its argument."""

    name: str
    arg: int

    @property
    def label(self) -> str:
        """The outcome label used by ``/sim/stats``."""
        return f"fault:{self.name}"


@dataclass(frozen=True)
class Directives:
    """What one request asked the simulator to do besides answering."""

    scenarios: frozenset[str] = frozenset()
    fault: Fault | None = None

    def has(self, scenario: str) -> bool:
        return scenario in self.scenarios


NONE = Directives()


def parse_fault(text: str) -> Fault:
    """``name`` or ``name:arg``; raise ValueError for unknown names or bad arguments."""
    name, _, arg_text = text.strip().partition(":")
    name = name.strip().lower()
    if name not in FAULTS:
        raise ValueError(f"unknown simulator fault {name!r}; known: {', '.join(sorted(FAULTS))}")
    default = FAULTS[name]
    if not arg_text:
        return Fault(name, default if default is not None else 0)
    if default is None:
        raise ValueError(f"simulator fault {name!r} takes no argument")
    try:
        arg = int(arg_text)
    except ValueError:
        raise ValueError(f"simulator fault {name!r} needs an integer argument") from None
    if arg < 0:
        raise ValueError(f"simulator fault {name!r} needs an argument >= 0")
    return Fault(name, arg)


def parse_scenarios(text: str) -> frozenset[str]:
    """A comma list of scenario names; raise ValueError for unknown ones."""
    names = frozenset(n.strip().lower() for n in text.split(",") if n.strip())
    unknown = names - SCENARIOS
    if unknown:
        raise ValueError(
            f"unknown simulator scenario(s) {', '.join(sorted(unknown))}; "
            f"known: {', '.join(sorted(SCENARIOS))}"
        )
    return names


def parse(headers: dict[str, str], body: bytes) -> Directives:
    """Directives from the request headers and prompt markers (header wins for the fault)."""
    scenario_text = headers.get("x-sim-scenario")
    fault_text = headers.get("x-sim-fault")
    if scenario_text is None and fault_text is None and b"[[" not in body:
        return NONE
    scenarios: frozenset[str] = frozenset()
    fault: Fault | None = None
    if b"[[" in body:
        for kind, value in _MARKER.findall(body):
            text = value.decode()
            if kind == b"sim":
                scenarios |= parse_scenarios(text)
            elif fault is None:
                fault = parse_fault(text)
    if scenario_text:
        scenarios |= parse_scenarios(scenario_text)
    if fault_text:
        fault = parse_fault(fault_text)
    return Directives(scenarios, fault)
