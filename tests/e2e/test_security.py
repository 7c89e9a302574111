"""Security through a real router: client API keys (401 before accounting, constant-time
check), the client's Authorization and hop-by-hop headers never reach engines (engines get
their own key from the configuration), and no secret appears in any answer, metric or log."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from fleet_support import http, wait_for
from procs import MODEL, Proc, metrics, router_config, start_router, start_sim
from test_faults_engine import HEALTH, chat, sim_stats

pytestmark = pytest.mark.timeout(90)

ENGINE_KEY = "sk-engine-3f9c1e7a5b2d4c6e8a0b"
ADMIN_TOKEN = "adm-7d41c9e2b8a6f035"
CLIENT_KEYS = ("ck-alpha-5e1f2a9c7b3d", "ck-beta-0a8e6c4d2f1b")
SECRETS = (ENGINE_KEY, ADMIN_TOKEN, *CLIENT_KEYS)
ENV = {
    "SEC_ENGINE_KEY": ENGINE_KEY,
    "SEC_ADMIN_TOKEN": ADMIN_TOKEN,
    "SEC_CLIENT_KEYS": f" {CLIENT_KEYS[0]} ,{CLIENT_KEYS[1]},",
}
AUTH = {"authorization": f"Bearer {CLIENT_KEYS[0]}"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, Proc]]:
    sim = start_sim("--tpot-ms", "1")
    engine = {"name": "e0", "url": sim.url, "dialect": "vllm", "api_key_env": "SEC_ENGINE_KEY"}
    cfg = router_config(
        [sim.url],
        engines=[engine],
        admission={"mode": "open"},
        health=HEALTH,
        admin={"token_env": "SEC_ADMIN_TOKEN"},
        auth={"api_keys_env": "SEC_CLIENT_KEYS"},
    )
    router = start_router(tmp_path_factory.mktemp("sec"), cfg, env=ENV)
    try:
        yield sim, router
    finally:
        router.stop()
        sim.stop()


def post(router: Proc, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    return http(router.url, "POST", "/v1/chat/completions", body, headers)


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Bearer wrong-key",
        f"Basic {CLIENT_KEYS[0]}",
        f"Bearer {CLIENT_KEYS[0]}x",
        f"Bearer {CLIENT_KEYS[0][:-1]}",
        f"{CLIENT_KEYS[0]}",
        f"Bearer {CLIENT_KEYS[0]},{CLIENT_KEYS[1]}",
    ],
)
def test_requests_without_a_valid_key_get_401_and_are_not_offered(
    fleet: tuple[Proc, Proc], authorization: str | None
) -> None:
    _, router = fleet
    before = metrics(router.url)["narwhal_offered_total"]
    headers = {} if authorization is None else {"authorization": authorization}
    for method, path, body in (
        ("POST", "/v1/chat/completions", chat("hi", stream=True)),
        ("POST", "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2}),
        ("GET", "/v1/models", None),
    ):
        status, hdrs, raw = http(router.url, method, path, body, headers)
        assert status == 401, (path, raw)
        assert hdrs.get("www-authenticate") == "Bearer"
        err = json.loads(raw)["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["code"] == "unauthorized" and err["type"] == "invalid_request_error"
    assert metrics(router.url)["narwhal_offered_total"] == before


def test_each_configured_key_is_accepted(fleet: tuple[Proc, Proc]) -> None:
    _, router = fleet
    for key in CLIENT_KEYS:
        for scheme in ("Bearer", "bearer"):
            status, _, raw = post(
                router, chat("hi", stream=False), {"authorization": f"{scheme} {key}"}
            )
            assert status == 200, raw
    status, _, raw = http(router.url, "GET", "/v1/models", None, AUTH)
    assert status == 200 and json.loads(raw)["data"][0]["id"] == MODEL
    for path in ("/health", "/ready", "/metrics", "/engines"):  # monitoring stays open
        assert http(router.url, "GET", path)[0] == 200, path


def test_the_openai_sdk_authenticates(fleet: tuple[Proc, Proc]) -> None:
    _, router = fleet
    good = openai.OpenAI(base_url=router.url + "/v1", api_key=CLIENT_KEYS[1], max_retries=0)
    answer = good.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert answer.choices[0].message.content is not None
    bad = openai.OpenAI(base_url=router.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


HOP_BY_HOP = {
    "connection": "keep-alive, x-private-hop",
    "keep-alive": "timeout=5",
    "te": "trailers",
    "trailer": "x-checksum",
    "proxy-authorization": "Basic cHJveHk6c2VjcmV0",
    "proxy-connection": "keep-alive",
    "x-private-hop": "drop-me",
    "x-forwarded-for": "203.0.113.9",
    "cookie": "session=abc",
}


def test_client_headers_never_reach_the_engine(fleet: tuple[Proc, Proc]) -> None:
    """The engine sees the router's own key, never the client's, and none of the client's
    hop-by-hop or other headers (only ``x-request-id`` is passed on, by design)."""
    sim, router = fleet
    headers = {**AUTH, **HOP_BY_HOP, "x-request-id": "req-sec-1"}
    status, _, raw = post(router, chat("hop by hop", stream=True), headers)
    assert status == 200, raw

    def engine_record() -> dict[str, Any] | None:
        for record in sim_stats(sim)["recent"]:
            if "hop by hop" in json.dumps(record["body"]):
                return record  # type: ignore[no-any-return]
        return None

    seen = {k.lower(): v for k, v in wait_for(engine_record)["headers"].items()}
    assert seen.get("authorization") == f"Bearer {ENGINE_KEY}"
    assert seen.get("x-request-id") == "req-sec-1"
    for name in HOP_BY_HOP:
        assert name not in seen or name == "connection", (name, seen)
    assert "x-private-hop" not in seen.get("connection", "")
    assert not any(key in json.dumps(seen) for key in CLIENT_KEYS)


def test_no_secret_in_answers_metrics_or_logs(fleet: tuple[Proc, Proc]) -> None:
    sim, router = fleet
    answers: list[bytes] = []

    def keep(resp: tuple[int, dict[str, str], bytes]) -> None:
        answers.append(json.dumps(resp[1]).encode() + resp[2])

    # refusals of every kind, some carrying near-miss or real secrets in the wrong place
    keep(post(router, chat("hi", stream=True), {"authorization": f"Bearer {ADMIN_TOKEN}"}))
    keep(post(router, chat("hi", stream=True), {"authorization": f"Bearer {ENGINE_KEY}"}))
    keep(http(router.url, "GET", "/admin/state", None, {"authorization": f"Bearer {ENGINE_KEY}"}))
    keep(
        http(router.url, "GET", "/admin/state", None, {"authorization": f"Bearer {CLIENT_KEYS[0]}"})
    )
    keep(http(router.url, "GET", "/admin/state", None, {"authorization": f"Bearer {ADMIN_TOKEN}"}))
    keep(
        http(router.url, "POST", "/admin/role", b"{bad", {"authorization": f"Bearer {ADMIN_TOKEN}"})
    )
    keep(post(router, {"model": ENGINE_KEY, "messages": []}, AUTH))
    for fault in (
        "http_500",
        "http_400",
        "reset_mid_stream:2",
        "error_event:1",
        "bool_ids:1",
        "malformed_json:1",
        "hang_mid_stream:1",
    ):
        for stream in (True, False):
            body = chat(f"[[fault:{fault}]]", stream=stream)
            keep(post(router, body, {**AUTH, "x-request-timeout": "0.5"}))
    keep(http(router.url, "GET", "/nope", None, AUTH))
    for path in ("/metrics", "/engines", "/ready", "/health", "/v1/models"):
        keep(http(router.url, "GET", path, None, AUTH))
    text = b"\n".join(answers)
    assert b'"code":"unauthorized"' in text and b"engine_error" in text  # the paths ran
    for secret in SECRETS:
        assert secret.encode() not in text, secret
    m = metrics(router.url)
    assert not any(secret in series for secret in SECRETS for series in m)
    # the router's whole output, to the end of its life (shutdown logs included)
    router.signal(signal.SIGTERM)
    router.wait(15)
    log = "".join(router.lines)
    assert "narwhal serving" in log
    for secret in SECRETS:
        assert secret not in log, secret
    assert sim_stats(sim)["received"] > 0


def test_a_named_but_empty_key_variable_fails_closed(tmp_path: Path) -> None:
    sim = start_sim("--tpot-ms", "1")
    cfg = router_config(
        [sim.url], admission={"mode": "open"}, auth={"api_keys_env": "SEC_UNSET_KEYS"}
    )
    router = start_router(tmp_path, cfg, env={"SEC_UNSET_KEYS": " , "})
    try:
        status, _, raw = post(router, chat("hi", stream=False), AUTH)
        assert status == 401, raw
        assert http(router.url, "GET", "/v1/models", None, {"authorization": "Bearer "})[0] == 401
        assert http(router.url, "GET", "/health")[0] == 200
        assert any(
            "auth.api_keys_env: SEC_UNSET_KEYS is unset or empty" in line for line in router.lines
        )
    finally:
        router.stop()
        sim.stop()
