"""How far the prompt-size estimate is from the engine's count, before and after calibration.

Realistic chat prompts (system prompts of several sizes, tool definitions, multi-turn
conversations with tool calls and results, prose, code and numbers) are counted exactly by
the simulator's tokenizer and chat template (the same code its ``/tokenize`` and
``prompt_token_ids`` use). The calibration sees the engine's count of the first
:data:`LEARN` requests, as the relay reports them, and is then scored on the rest.
``python -m benches.harness.sizing`` prints the figures as JSON.
"""

from __future__ import annotations

import json
import random
import statistics
from typing import Any

import orjson

from narwhal.admission.calibration import Calibration
from narwhal.admission.sizing import EstimateSizer
from narwhal.request.parse import parse_request
from narwhal.sim import tokenizer

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
LEARN = 20
SCORED = 200

_PROSE = (
    "The quarterly report shows revenue grew 12% to $4.2M, driven by enterprise renewals. "
    "Please summarise the attached meeting notes and list three action items with owners. "
    "Kubernetes schedules pods onto nodes; a readiness probe gates traffic until the app is up. "
    "Résumé: 8 years of backend work (Go, Rust, Python), on-call for 40k req/s services. "
    "In 1969, Apollo 11 landed on the Moon; Armstrong's first words were broadcast worldwide. "
    "Error: connection refused (ECONNREFUSED) at 10.0.3.7:5432 after 3 retries; check pg_hba. "
    "Could you translate 'good morning, how are you?' into French, German and Japanese? "
    "The function returns None when the cache misses, so callers must handle that case. "
)
_CODE = (
    "def fib(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
    "    return a\n",
    "SELECT user_id, COUNT(*) AS orders FROM orders WHERE created_at > NOW() - INTERVAL '7 days'"
    " GROUP BY user_id ORDER BY orders DESC LIMIT 20;",
    "fn main() {\n    let v: Vec<u32> = (1..=10).map(|x| x * x).collect();\n"
    "    println!(\"{:?}\", v);\n}\n",
)
_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search_orders", "description": "Find a customer's orders by status and date.",
        "parameters": {"type": "object", "properties": {
            "customer_id": {"type": "integer"}, "status": {"type": "string"},
            "since": {"type": "string", "format": "date"}},
            "required": ["customer_id"]}}},
]


def _text(rng: random.Random, sentences: int) -> str:
    pool = _PROSE.split(". ")
    parts = [rng.choice(pool) for _ in range(sentences)]
    if rng.random() < 0.25:
        parts.append(rng.choice(_CODE))
    return ". ".join(parts)


def chat_body(rng: random.Random) -> dict[str, Any]:
    """One realistic chat request body."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": _text(rng, rng.choice((1, 3, 8, 20)))}]
    tools = rng.random() < 0.3
    for turn in range(rng.choice((1, 1, 2, 3, 5))):
        messages.append({"role": "user", "content": _text(rng, rng.randint(1, 6))})
        if turn and tools and rng.random() < 0.5:
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{turn}", "type": "function", "function": {
                    "name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]})
            messages.append({"role": "tool", "tool_call_id": f"call_{turn}",
                             "content": json.dumps({"temp_c": 18, "sky": "cloudy"})})
        messages.append({"role": "assistant", "content": _text(rng, rng.randint(1, 4))})
    messages.append({"role": "user", "content": _text(rng, rng.randint(1, 3))})
    body: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": 64}
    if tools:
        body["tools"] = _TOOLS
    return body


def engine_count(body: dict[str, Any]) -> int:
    """The simulator engine's exact count (what /tokenize and prompt_token_ids report)."""
    return len(tokenizer.encode_chat(body["messages"], body.get("tools")))


def _errors(predict: Any, cases: list[tuple[Any, int]]) -> list[float]:
    return sorted(abs(predict(p) - n) / n for p, n in cases)


def accuracy(seed: int = 7) -> dict[str, Any]:
    """Median and p90 absolute relative error of the static and the calibrated estimate."""
    rng = random.Random(seed)
    cases = []
    for _ in range(LEARN + SCORED):
        body = chat_body(rng)
        cases.append((parse_request("chat", orjson.dumps(body), model=MODEL),
                      engine_count(body)))
    calibration = Calibration()
    for parsed, count in cases[:LEARN]:
        calibration.observe(parsed, count)
    scored = cases[LEARN:]
    static = _errors(EstimateSizer.size_now, scored)
    calibrated = _errors(calibration.tokens, scored)

    def summary(errors: list[float]) -> dict[str, float]:
        return {"median": round(statistics.median(errors), 4),
                "p90": round(errors[int(0.9 * (len(errors) - 1))], 4)}

    return {"learned_from": LEARN, "scored": len(scored), "static": summary(static),
            "calibrated": summary(calibrated),
            "band": round(calibration.band(cases[0][0]), 4)}


if __name__ == "__main__":
    print(json.dumps(accuracy(), indent=2))
