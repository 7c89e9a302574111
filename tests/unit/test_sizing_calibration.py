"""Sizing without a round trip: the calibrated estimate and when admission asks for more."""

from __future__ import annotations

import orjson
import pytest
from benches.harness.sizing import LEARN, accuracy
from test_learning_predictive import admission, parsed

from narwhal.admission.calibration import (
    MIN_FIT,
    UNCALIBRATED_BAND,
    Calibration,
    Sizing,
    make_sizing,
)
from narwhal.admission.predictive import NearBudget
from narwhal.admission.sizing import EngineSizer, EstimateSizer
from narwhal.config import EngineConfig
from narwhal.fleet.engine import Engine
from narwhal.request.parse import Parsed, parse_request
from narwhal.upstream.client import EngineClient

MODEL = "m"


def chat(text: str, system: str = "Be brief.") -> Parsed:
    body = {"model": MODEL, "messages": [{"role": "system", "content": system},
                                         {"role": "user", "content": text}]}
    return parse_request("chat", orjson.dumps(body), model=MODEL)


def test_on_realistic_prompts_twenty_engine_counts_bring_the_median_error_under_5_percent(
) -> None:
    figures = accuracy()
    assert figures["learned_from"] == LEARN == 20
    assert figures["calibrated"]["median"] <= 0.05, figures
    assert figures["calibrated"]["median"] < figures["static"]["median"] / 2, figures
    assert figures["calibrated"]["p90"] < figures["static"]["p90"], figures


def test_before_any_count_the_static_estimate_is_used_with_a_wide_band() -> None:
    cal = Calibration()
    p = chat("How many tokens is this?")
    assert cal.tokens(p) == EstimateSizer.size_now(p)
    assert cal.band(p) == UNCALIBRATED_BAND


def test_a_fit_follows_the_engines_counts_and_narrows_the_band() -> None:
    cal = Calibration()
    # An engine whose tokenizer makes one token of every 3 characters, 5 per message.
    samples = [chat("word " * n, system="sys " * (n % 7)) for n in range(10, 10 + 3 * MIN_FIT)]
    for p in samples:
        cal.observe(p, p.prompt_text_chars // 3 + 5 * p.messages)
    probe = chat("word " * 200, system="sys " * 3)
    truth = probe.prompt_text_chars // 3 + 5 * probe.messages
    assert abs(cal.tokens(probe) - truth) / truth < 0.03
    assert cal.band(probe) < UNCALIBRATED_BAND


def test_token_id_prompts_and_lists_of_prompts_teach_nothing() -> None:
    cal = Calibration()
    ids = parse_request("completion", b'{"model": "m", "prompt": [1, 2, 3]}', model=MODEL)
    many = parse_request("completion", b'{"model": "m", "prompt": ["ab cd", "ef"]}',
                         model=MODEL)
    for _ in range(3 * MIN_FIT):
        cal.observe(ids, 3)
        cal.observe(many, 1)  # a stream's prompt_token_ids cover only the first prompt
    assert cal.describe() == []
    assert cal.tokens(ids) == 3


def test_auto_sizing_is_calibrated_with_tokenize_only_as_a_fallback() -> None:
    cfg = EngineConfig(name="e0", url="http://127.0.0.1:9")
    engines = [Engine(0, cfg, EngineClient(cfg.url))]
    auto = make_sizing("auto", engines, None)
    assert auto.calibration is not None and isinstance(auto.exact, EngineSizer)
    p = chat("hello")
    assert auto.band(p) == UNCALIBRATED_BAND
    assert isinstance(make_sizing("engine", engines, None).sizer, EngineSizer)
    assert make_sizing("estimate", engines, None).band(p) == 0.0
    openai = [Engine(0, EngineConfig(name="e0", url="http://127.0.0.1:9", dialect="openai"),
                     EngineClient("http://127.0.0.1:9"))]
    assert make_sizing("auto", openai, None).band(p) == 0.0  # nothing exact to ask
    assert Sizing(EstimateSizer()).band(p) == 0.0


@pytest.mark.parametrize(("tokens", "band", "near"), [
    (1985, 0.05, True),   # 1.995 s alone against a 2 s budget: within 5 % of the prompt part
    (1985, 0.0, False),   # no band: the decision stands
    (500, 0.05, False),   # 0.51 s: far under
    (3000, 0.05, False),  # 3.01 s alone: far over, refused whatever the exact count
])
def test_admission_asks_for_the_exact_count_only_near_the_budget(
        tokens: int, band: float, near: bool) -> None:
    adm = admission()
    try:
        adm.admit(parsed(tokens), tokens, band)  # type: ignore[arg-type]
    except NearBudget:
        assert near
        return
    except Exception:  # a refusal: decided without the exact count
        assert not near
        return
    assert not near
