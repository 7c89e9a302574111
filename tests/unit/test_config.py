"""Tests for narwhal.config: defaults, validation messages, secrets, the example file, the demo."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from narwhal.config import (
    HA,
    MAX_ENGINES,
    Admin,
    Admission,
    Config,
    ConfigError,
    EngineConfig,
    EngineSettings,
    Health,
    Lease,
    Listen,
    Serving,
    demo_config,
    load_config,
    parse_config,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "narwhal.example.yaml"
DOCS = ROOT / "docs" / "configuration.md"


def minimal(**extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "model": "m",
        "engines": [{"name": "a0", "url": "http://10.0.0.5:8000"}],
    }
    data.update(extra)
    return data


def with_engine(**keys: Any) -> dict[str, Any]:
    return minimal(engines=[{"name": "a0", "url": "http://10.0.0.5:8000", **keys}])


def error_of(data: object) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(data, source="test.yaml")
    return info.value


def schema_keys(cls: type, prefix: str = "") -> set[str]:
    """Every dotted key the dataclasses describe (engines as `engines[]`)."""
    keys: set[str] = set()
    for f in dataclasses.fields(cls):
        rule = f.metadata["rule"]
        path = f"{prefix}{f.name}"
        if not dataclasses.is_dataclass(rule.kind):  # a scalar, or a list of scalars
            keys.add(path)
        else:
            keys |= schema_keys(rule.kind, f"{path}[]." if rule.many else f"{path}.")
    return keys


def document_keys(data: Any, prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            keys |= document_keys(value, f"{path}.")
        elif isinstance(value, list) and all(isinstance(item, dict) for item in value):
            for item in value:
                keys |= document_keys(item, f"{path}[].")
        else:
            keys.add(path)
    return keys


# ---------------------------------------------------------------- defaults


def test_minimal_file_takes_every_default() -> None:
    config = parse_config(minimal())
    assert config.model == "m"
    assert config.listen == Listen(host="127.0.0.1", port=8000)
    assert config.serving == Serving(
        max_request_bytes=1048576,
        http_retention_limit=4096,
        request_timeout_s=600.0,
        header_timeout_s=10.0,
        max_header_bytes=65536,
        max_headers=100,
        keepalive_timeout_s=5.0,
        shutdown_grace_s=30.0,
        write_buffer_high_bytes=262144,
    )
    assert config.admission == Admission(
        mode="predictive", queue_limit=1024, max_wait_s=10.0, ttft_budget_s=2.0
    )
    assert config.engines == (
        EngineConfig(
            name="a0",
            url="http://10.0.0.5:8000",
            dialect="vllm",
            role="mixed",
            wave="default",
            max_prefill=256,
            max_decode=256,
            api_key_env=None,
            weight=1.0,
        ),
    )
    assert config.health == Health(
        interval_s=1.0,
        timeout_s=1.0,
        failures_to_evict=3,
        successes_to_restore=2,
        monitoring_stale_s=10.0,
    )
    assert config.ha == HA(
        role="active", lease=Lease(backend="none", url=None, key="narwhal:lease", ttl_s=5.0)
    )
    assert config.admin == Admin(token_env=None)
    assert config.tokenizer is None
    assert config.state_file is None


def test_config_is_frozen() -> None:
    config = parse_config(minimal())
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.model = "other"  # type: ignore[misc]


def test_floats_accept_ints_and_come_out_as_floats() -> None:
    config = parse_config(minimal(serving={"request_timeout_s": 30}))
    assert config.serving.request_timeout_s == 30.0
    assert isinstance(config.serving.request_timeout_s, float)


def test_empty_section_means_defaults() -> None:
    config = parse_config(minimal(serving=None, health=None, ha={"lease": None}))
    assert config.serving == Serving()
    assert config.health == Health()
    assert config.ha == HA()


def test_spec_example_parses() -> None:
    text = """
model: meta-llama/Llama-3.1-8B-Instruct
listen: {host: 127.0.0.1, port: 8000}
serving: {max_request_bytes: 1048576, http_retention_limit: 4096, request_timeout_s: 600}
admission: {mode: predictive, queue_limit: 1024, max_wait_s: 10, ttft_budget_s: 2.0}
engines:
  - {name: a0, url: http://10.0.0.5:8000, dialect: vllm, role: mixed, wave: a,
     max_prefill: 16, max_decode: 256, api_key_env: A0_KEY}
health: {interval_s: 1, timeout_s: 1, failures_to_evict: 3, successes_to_restore: 2,
         monitoring_stale_s: 10}
ha: {role: active, lease: {backend: none}}
admin: {token_env: NARWHAL_ADMIN_TOKEN}
"""
    config = parse_config(yaml.safe_load(text))
    assert config.admission.mode == "predictive"
    assert config.engines[0].wave == "a"
    assert config.engines[0].api_key_env == "A0_KEY"
    assert config.admin.token_env == "NARWHAL_ADMIN_TOKEN"


def test_engine_host_and_port() -> None:
    engines = [
        {"name": "a", "url": "http://10.0.0.5:8000"},
        {"name": "b", "url": "http://[::1]:9000/"},
    ]
    config = parse_config(minimal(engines=engines))
    assert (config.engines[0].host, config.engines[0].port) == ("10.0.0.5", 8000)
    assert (config.engines[1].host, config.engines[1].port) == ("::1", 9000)


def test_redis_lease() -> None:
    lease = {"backend": "redis", "url": "redis://r:6379/0", "key": "k", "ttl_s": 3}
    config = parse_config(minimal(ha={"role": "standby", "lease": lease}))
    assert config.ha == HA(role="standby", lease=Lease("redis", "redis://r:6379/0", "k", 3.0))


def test_disaggregated_fleet() -> None:
    engines = [
        {"name": "p", "url": "http://h:1", "role": "prefill"},
        {"name": "d", "url": "http://h:2", "role": "decode"},
    ]
    assert [e.role for e in parse_config(minimal(engines=engines)).engines] == ["prefill", "decode"]


def test_at_most_256_engines() -> None:
    engines = [{"name": f"e{i}", "url": f"http://h:{1000 + i}"} for i in range(MAX_ENGINES)]
    assert len(parse_config(minimal(engines=engines)).engines) == MAX_ENGINES
    engines.append({"name": "extra", "url": "http://h:9999"})
    err = error_of(minimal(engines=engines))
    assert err.key == "engines"
    assert "at most 256" in str(err) and "257" in str(err)


# ---------------------------------------------------------------- every error names key and value

HUGE = "1" + "0" * 76 + "..."  # 10**400, shortened in the message
BAD_VALUES = [
    # (document, dotted key, the value as it must appear in the message)
    (minimal(model=""), "model", "''"),
    (minimal(model=7), "model", "7"),
    (minimal(listen={"port": 70000}), "listen.port", "70000"),
    (minimal(listen={"port": -1}), "listen.port", "-1"),
    (minimal(listen={"port": "80"}), "listen.port", "'80'"),
    (minimal(listen={"host": None}), "listen.host", "null"),
    (minimal(serving={"max_request_bytes": 0}), "serving.max_request_bytes", "0"),
    (minimal(serving={"max_request_bytes": True}), "serving.max_request_bytes", "true"),
    (minimal(serving={"max_headers": 10.0}), "serving.max_headers", "10.0"),
    (minimal(serving={"request_timeout_s": 0}), "serving.request_timeout_s", "0"),
    (minimal(serving={"header_timeout_s": -1.5}), "serving.header_timeout_s", "-1.5"),
    (minimal(serving={"keepalive_timeout_s": float("inf")}), "serving.keepalive_timeout_s", "inf"),
    (minimal(serving={"request_timeout_s": float("nan")}), "serving.request_timeout_s", "nan"),
    (minimal(serving={"request_timeout_s": 10**400}), "serving.request_timeout_s", HUGE),
    (minimal(serving={"shutdown_grace_s": False}), "serving.shutdown_grace_s", "false"),
    (minimal(serving={"shutdown_grace_s": -1}), "serving.shutdown_grace_s", "-1"),
    (minimal(serving={"http_retention_limit": 0}), "serving.http_retention_limit", "0"),
    (minimal(admission={"mode": "closed"}), "admission.mode", "'closed'"),
    (minimal(admission={"queue_limit": -1}), "admission.queue_limit", "-1"),
    (minimal(admission={"max_wait_s": 0}), "admission.max_wait_s", "0"),
    (minimal(admission={"ttft_budget_s": "2s"}), "admission.ttft_budget_s", "'2s'"),
    (with_engine(max_prefill=0), "engines[0].max_prefill", "0"),
    (with_engine(max_decode=True), "engines[0].max_decode", "true"),
    (with_engine(dialect="tgi"), "engines[0].dialect", "'tgi'"),
    (with_engine(role="both"), "engines[0].role", "'both'"),
    (with_engine(wave=1), "engines[0].wave", "1"),
    (with_engine(wave="*"), "engines[0].wave", "'*'"),
    (with_engine(weight=0), "engines[0].weight", "0"),
    (with_engine(api_key_env="MY-KEY"), "engines[0].api_key_env", "'MY-KEY'"),
    (with_engine(name="a b"), "engines[0].name", "'a b'"),
    (
        minimal(engines=[{"name": "a", "url": "https://h:8000"}]),
        "engines[0].url",
        "'https://h:8000'",
    ),
    (minimal(engines=[{"name": "a", "url": "h:8000"}]), "engines[0].url", "'h:8000'"),
    (minimal(engines=[{"name": "a", "url": "http://h"}]), "engines[0].url", "'http://h'"),
    (minimal(engines=[{"name": "a", "url": "http://h:0"}]), "engines[0].url", "'http://h:0'"),
    (
        minimal(engines=[{"name": "a", "url": "http://h:99999"}]),
        "engines[0].url",
        "'http://h:99999'",
    ),
    (minimal(engines=[{"name": "a", "url": "http://h:1/v1"}]), "engines[0].url", "'http://h:1/v1'"),
    (minimal(engines=["http://h:1"]), "engines[0]", "'http://h:1'"),
    (minimal(engines=[]), "engines", "[]"),
    (minimal(engines={"name": "a"}), "engines", "{'name': 'a'}"),
    (minimal(health={"interval_s": 0}), "health.interval_s", "0"),
    (minimal(health={"timeout_s": -1}), "health.timeout_s", "-1"),
    (minimal(health={"failures_to_evict": 0}), "health.failures_to_evict", "0"),
    (minimal(health={"successes_to_restore": 0}), "health.successes_to_restore", "0"),
    (minimal(health={"monitoring_stale_s": 1}), "health.monitoring_stale_s", "1"),
    (minimal(ha={"role": "leader"}), "ha.role", "'leader'"),
    (minimal(ha={"lease": {"backend": "etcd"}}), "ha.lease.backend", "'etcd'"),
    (minimal(ha={"lease": {"backend": "redis"}}), "ha.lease.url", "null"),
    (minimal(ha={"lease": {"url": "redis://r:6379"}}), "ha.lease.url", "'redis://r:6379'"),
    (minimal(ha={"lease": {"backend": "redis", "url": "r:6379"}}), "ha.lease.url", "'r:6379'"),
    (minimal(ha={"lease": {"ttl_s": 0}}), "ha.lease.ttl_s", "0"),
    (minimal(ha={"lease": {"key": ""}}), "ha.lease.key", "''"),
    (minimal(ha="active"), "ha", "'active'"),
    (minimal(admin={"token_env": ""}), "admin.token_env", "''"),
    (minimal(admin={"token_env": "1TOKEN"}), "admin.token_env", "'1TOKEN'"),
    (minimal(tokenizer=5), "tokenizer", "5"),
    (minimal(state_file=""), "state_file", "''"),
]


@pytest.mark.parametrize(("data", "key", "shown"), BAD_VALUES, ids=[k for _, k, _ in BAD_VALUES])
def test_error_names_key_and_value(data: dict[str, Any], key: str, shown: str) -> None:
    err = error_of(data)
    assert isinstance(err, ValueError)
    assert err.problems == ((key, err.problems[0][1]),)
    assert str(err).startswith(f"test.yaml: {key}: ")
    assert str(err).endswith(f"got {shown}")


def test_messages_say_what_is_expected() -> None:
    assert "must be an integer from 0 to 65535, got 70000" in str(
        error_of(minimal(listen={"port": 70000}))
    )
    text = str(error_of(with_engine(dialect="tgi")))
    assert "one of 'vllm', 'sglang', 'openai'" in text
    text = str(error_of(minimal(engines=[{"name": "a", "url": "https://h:8000"}])))
    assert "https engines are not supported yet" in text


def test_required_keys() -> None:
    err = error_of({"listen": {}})
    assert [key for key, _ in err.problems] == ["model", "engines"]
    assert all(text == "is required" for _, text in err.problems)
    err = error_of(minimal(engines=[{"dialect": "vllm"}]))
    assert [key for key, _ in err.problems] == ["engines[0].name", "engines[0].url"]


def test_whole_document_errors() -> None:
    assert str(error_of(None)) == "test.yaml: is empty (model and engines are required)"
    assert str(error_of(["model"])) == "test.yaml: must be a mapping of keys, got ['model']"
    assert error_of("model: m").key == ""


def test_every_problem_is_reported_at_once() -> None:
    data = minimal(listen={"port": -1}, admission={"mode": "x"})
    data["engines"] = [
        {"name": "a", "url": "http://h:1", "max_prefill": 0},
        {"name": "b", "url": "https://h:2"},
    ]
    err = error_of(data)
    keys = [key for key, _ in err.problems]
    assert keys == ["listen.port", "admission.mode", "engines[0].max_prefill", "engines[1].url"]
    assert str(err).startswith("test.yaml: 4 problems:\n  listen.port: ")


# ---------------------------------------------------------------- cross-key checks


def test_engine_names_unique() -> None:
    engines = [{"name": "a", "url": "http://h:1"}, {"name": "a", "url": "http://h:2"}]
    err = error_of(minimal(engines=engines))
    assert err.problems == (("engines[1].name", "duplicates engines[0].name, got 'a'"),)


def test_engine_urls_unique() -> None:
    engines = [{"name": "a", "url": "http://h:1"}, {"name": "b", "url": "http://H:1/"}]
    err = error_of(minimal(engines=engines))
    assert err.key == "engines[1].url"
    assert "engines[0].url" in str(err) and "'http://H:1/'" in str(err)


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_disaggregation_needs_both_roles(role: str) -> None:
    err = error_of(with_engine(role=role))
    assert err.key == "engines"
    assert repr(role) in str(err)


# ---------------------------------------------------------------- unknown keys


@pytest.mark.parametrize(
    ("data", "key", "hint"),
    [
        (minimal(servng={}), "servng", "serving"),
        (minimal(engine=[]), "engine", "engines"),
        (minimal(flavour="blue"), "flavour", None),
        (minimal(serving={"max_request_byte": 5}), "serving.max_request_byte", "max_request_bytes"),
        (minimal(ha={"lease": {"ttl": 5}}), "ha.lease.ttl", "ttl_s"),
        (with_engine(max_prefil=8), "engines[0].max_prefil", "max_prefill"),
        (with_engine(api_key="sk-secret"), "engines[0].api_key", "api_key_env"),
        (with_engine(gpu="h100"), "engines[0].gpu", None),
        (minimal(admin={"token": "t"}), "admin.token", "token_env"),
    ],
)
def test_unknown_keys(data: dict[str, Any], key: str, hint: str | None) -> None:
    err = error_of(data)
    assert err.key == key
    message = err.problems[0][1]
    assert message.startswith("unknown key")
    if hint is None:
        assert "did you mean" not in message
    else:
        assert f"(did you mean {hint!r}?)" in message


def test_unknown_key_in_second_engine() -> None:
    data = minimal(
        engines=[{"name": "a", "url": "http://h:1"}, {"name": "b", "url": "http://h:2", "wav": "x"}]
    )
    err = error_of(data)
    assert err.key == "engines[1].wav"
    assert "did you mean 'wave'?" in str(err)


def test_huge_integer_is_accepted_as_an_integer() -> None:
    assert parse_config(minimal(serving={"max_request_bytes": 10**400})).serving.max_request_bytes


def test_non_string_key() -> None:
    assert error_of(minimal(serving={1: 2})).key == "serving.1"


# ---------------------------------------------------------------- secrets from the environment


def test_engine_api_key_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = parse_config(with_engine(api_key_env="A0_KEY")).engines[0]
    monkeypatch.delenv("A0_KEY", raising=False)
    assert engine.api_key is None
    monkeypatch.setenv("A0_KEY", "")
    assert engine.api_key is None
    monkeypatch.setenv("A0_KEY", "sk-123")
    assert engine.api_key == "sk-123"
    assert "sk-123" not in repr(engine)
    assert parse_config(minimal()).engines[0].api_key is None


def test_missing_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    engines = [
        {"name": "a", "url": "http://h:1", "api_key_env": "A_KEY"},
        {"name": "b", "url": "http://h:2", "api_key_env": "B_KEY"},
        {"name": "c", "url": "http://h:3"},
    ]
    config = parse_config(minimal(engines=engines))
    monkeypatch.setenv("A_KEY", "sk-a")
    monkeypatch.delenv("B_KEY", raising=False)
    assert config.missing_secrets() == ("engines[1].api_key_env: B_KEY is unset or empty",)


def test_admin_token_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_config(minimal()).admin.token is None
    admin = parse_config(minimal(admin={"token_env": "NARWHAL_ADMIN_TOKEN"})).admin
    monkeypatch.delenv("NARWHAL_ADMIN_TOKEN", raising=False)
    assert admin.token is None
    monkeypatch.setenv("NARWHAL_ADMIN_TOKEN", "")
    assert admin.token is None
    monkeypatch.setenv("NARWHAL_ADMIN_TOKEN", "s3cret")
    assert admin.token == "s3cret"


# ---------------------------------------------------------------- files


def test_load_config(tmp_path: Path) -> None:
    path = tmp_path / "narwhal.yaml"
    path.write_text("model: m\nengines:\n  - {name: a0, url: 'http://h:8000', max_prefill: 4}\n")
    assert load_config(path).engines[0].max_prefill == 4
    assert load_config(str(path)).model == "m"


def test_load_config_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "narwhal.yaml"
    path.write_text("model: m\nengines:\n  - {name: a0, url: 'http://h:8000', max_prefill: 0}\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: engines[0].max_prefill: ")):
        load_config(path)
    with pytest.raises(ConfigError, match=re.escape(f"{tmp_path / 'absent.yaml'}: cannot read")):
        load_config(tmp_path / "absent.yaml")
    path.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: invalid YAML")):
        load_config(path)
    path.write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        load_config(path)


def test_duplicate_yaml_keys_are_errors(tmp_path: Path) -> None:
    path = tmp_path / "narwhal.yaml"
    path.write_text(
        "model: m\nengines: [{name: a0, url: 'http://h:1'}]\n"
        "serving: {max_request_bytes: 10}\nserving: {max_headers: 5}\n"
    )
    with pytest.raises(ConfigError, match="duplicate key 'serving'") as info:
        load_config(path)
    assert "line 4" in str(info.value)


def test_example_file_parses_and_shows_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_config(EXAMPLE)
    assert config.model == "meta-llama/Llama-3.1-8B-Instruct"
    # Every section is at its default except the example values marked in the file.
    assert (config.listen, config.serving, config.admission) == (Listen(), Serving(), Admission())
    assert (config.health, config.ha) == (Health(), HA())
    assert (config.tokenizer, config.state_file) == (None, None)
    first = dataclasses.replace(config.engines[0], wave="default", api_key_env=None)
    assert first == EngineConfig(name="a0", url="http://10.0.0.5:8000")
    assert config.admin.token_env == "NARWHAL_ADMIN_TOKEN"
    monkeypatch.delenv("NARWHAL_ADMIN_TOKEN", raising=False)
    assert config.admin.token is None


COMMENTED = {"models[].name", "models[].aliases", "models[].ttft_budget_s"} | {
    f"discovery.dns.{key}" for key in ("name", "port", "interval_s", "resolver")} | {
    f"discovery.dns.engine.{f.name}" for f in dataclasses.fields(EngineSettings)}
"""Keys the example shows commented out (``models`` is the alternative to its ``model``, DNS
discovery to the file)."""


def test_example_file_has_every_key() -> None:
    with EXAMPLE.open() as stream:
        shown = document_keys(yaml.safe_load(stream))
    assert shown == schema_keys(Config) - COMMENTED
    text = EXAMPLE.read_text()
    commented = "\n".join(line.replace("#", " ", 1) for line in text.splitlines()
                          if line.startswith(("#   ", "# models:", "# discovery:")))
    assert document_keys(yaml.safe_load(commented)) == COMMENTED


def test_docs_describe_every_key() -> None:
    text = DOCS.read_text()
    for key in sorted(schema_keys(Config)):
        section, _, leaf = key.rpartition(".")
        assert f"`{leaf}`" in text, key
        if section:
            assert f"## `{section}`" in text, section


# ---------------------------------------------------------------- demo


def test_demo_config() -> None:
    config = demo_config(["http://127.0.0.1:9001", "http://127.0.0.1:9002"], port=0, model="demo")
    assert config.model == "demo"
    assert config.listen == Listen(host="127.0.0.1", port=0)
    assert [(e.name, e.url, e.dialect) for e in config.engines] == [
        ("sim0", "http://127.0.0.1:9001", "vllm"),
        ("sim1", "http://127.0.0.1:9002", "vllm"),
    ]
    assert (config.serving, config.admission, config.health, config.ha, config.admin) == (
        Serving(),
        Admission(),
        Health(),
        HA(),
        Admin(),
    )


def test_demo_config_defaults_and_errors() -> None:
    config = demo_config(["http://127.0.0.1:9001"])
    assert config.listen.port == 8000
    assert config.model == "narwhal-demo"
    with pytest.raises(ConfigError, match="engines: must be a non-empty list"):
        demo_config([])
    with pytest.raises(ConfigError, match=re.escape("engines[0].url")):
        demo_config(["https://127.0.0.1:9001"])


# ---------------------------------------------------------------- several models


def models_doc(models: Any, engines: Any = None) -> dict[str, Any]:
    return {"models": models,
            "engines": engines or [{"name": "a0", "url": "http://10.0.0.5:8000"}]}


def test_models_and_engine_models_parse() -> None:
    config = parse_config(models_doc(
        [{"name": "llama", "aliases": ["l8b"], "ttft_budget_s": 1}, {"name": "qwen"}],
        [{"name": "a0", "url": "http://h:1", "models": ["llama"]},
         {"name": "b0", "url": "http://h:2"}]))
    assert config.model is None and config.default_model == "llama"
    assert [(m.name, m.aliases, m.ttft_budget_s) for m in config.served_models] == [
        ("llama", ("l8b",), 1.0), ("qwen", (), None)]
    assert [e.models for e in config.engines] == [("llama",), None]
    one = parse_config(minimal())
    assert one.models == () and [m.name for m in one.served_models] == ["m"]


@pytest.mark.parametrize(("data", "key", "text"), [
    (minimal(models=[{"name": "x"}]), "models", "give one or the other"),
    (models_doc([]), "models", "must be a non-empty list, got []"),
    (models_doc([{"name": "a", "aliases": ["b", "b"]}]), "models[0].aliases[1]",
     "is listed twice, got 'b'"),
    (models_doc([{"name": "a", "aliases": ["x"]}, {"name": "x"}]), "models[1].name",
     "duplicates models[0].aliases[0], got 'x'"),
    (models_doc([{"name": "a"}], [{"name": "a0", "url": "http://h:1", "models": ["b"]}]),
     "engines[0].models[0]", "names no configured model, got 'b'"),
    (models_doc([{"name": "a", "aliases": ["b"]}],
                [{"name": "a0", "url": "http://h:1", "models": ["b"]}]),
     "engines[0].models[0]", "(an alias at models[0].aliases[0]: name the model), got 'b'"),
    (models_doc([{"name": "a"}, {"name": "c"}],
                [{"name": "a0", "url": "http://h:1", "models": ["a"]}]),
     "models[1].name", "no engine serves it (engines[].models), got 'c'"),
    (models_doc([{"name": "a", "ttft_budget_s": 0}]), "models[0].ttft_budget_s",
     "must be a number > 0, got 0"),
    (models_doc([{"name": " a"}]), "models[0].name", "must not start or end with spaces"),
    (models_doc([{"name": "a", "alias": ["b"]}]), "models[0].alias",
     "unknown key (did you mean 'aliases'?)"),
    (with_engine(models=[]), "engines[0].models", "must be a non-empty list, got []"),
    (with_engine(models="m"), "engines[0].models", "must be a non-empty list, got 'm'"),
])
def test_model_errors_name_the_key_and_value(data: dict[str, Any], key: str,
                                              text: str) -> None:
    err = error_of(data)
    assert err.key == key, str(err)
    assert text in str(err)
