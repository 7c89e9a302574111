"""The configuration's sections as frozen dataclasses: every key, its default and its Rule."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal, get_args
from urllib.parse import urlsplit

from narwhal.config.schema import (
    MAX_ENGINES,
    engine_name,
    engine_url,
    env_name,
    header_name,
    lease_url,
    model_name,
    otlp_url,
    rule,
    wave_name,
)

Dialect = Literal["vllm", "sglang", "openai"]
EngineRole = Literal["mixed", "prefill", "decode"]
AdmissionMode = Literal["open", "predictive"]
PlacementPolicy = Literal["lowest_ttft", "prefix_affinity", "least_loaded"]
HARole = Literal["active", "standby"]
LeaseBackend = Literal["none", "redis"]
SizingMode = Literal["auto", "tokenizer", "engine", "estimate"]
LogFormat = Literal["text", "json"]
ClusterBackend = Literal["none", "redis"]

DEMO_MODEL = "narwhal-demo"


def _secret(env: str | None) -> str | None:
    return (os.environ.get(env) or None) if env else None


@dataclass(frozen=True, slots=True)
class Listen:
    """Where the router accepts client connections."""

    host: str = field(default="127.0.0.1", metadata=rule(str))
    port: int = field(default=8000, metadata=rule(int, ge=0, le=65535))


@dataclass(frozen=True, slots=True)
class Serving:
    """HTTP serving limits and timeouts."""

    max_request_bytes: int = field(default=1048576, metadata=rule(int, ge=1))
    http_retention_limit: int = field(default=4096, metadata=rule(int, ge=1))
    request_timeout_s: float = field(default=600.0, metadata=rule(float, gt=0))
    header_timeout_s: float = field(default=10.0, metadata=rule(float, gt=0))
    max_header_bytes: int = field(default=65536, metadata=rule(int, ge=1))
    max_headers: int = field(default=100, metadata=rule(int, ge=1))
    keepalive_timeout_s: float = field(default=5.0, metadata=rule(float, gt=0))
    shutdown_grace_s: float = field(default=30.0, metadata=rule(float, ge=0))
    write_buffer_high_bytes: int = field(default=262144, metadata=rule(int, ge=1))
    # How many times one request's answer may move to another engine after its stream broke.
    max_migrations: int = field(default=1, metadata=rule(int, ge=0))


@dataclass(frozen=True, slots=True)
class Admission:
    """Admission policy: open, or predictive against a TTFT budget."""

    mode: AdmissionMode = field(
        default="predictive", metadata=rule(str, choices=get_args(AdmissionMode))
    )
    queue_limit: int = field(default=1024, metadata=rule(int, ge=0))
    max_wait_s: float = field(default=10.0, metadata=rule(float, gt=0))
    ttft_budget_s: float = field(default=2.0, metadata=rule(float, gt=0))
    sizing: SizingMode = field(default="auto", metadata=rule(str, choices=get_args(SizingMode)))
    drift_threshold: float = field(default=0.5, metadata=rule(float, gt=0))


@dataclass(frozen=True, slots=True)
class Scheduling:
    """Placement: the policy that picks an engine among the eligible ones."""

    policy: PlacementPolicy = field(
        default="lowest_ttft", metadata=rule(str, choices=get_args(PlacementPolicy))
    )
    affinity_prefix_chars: int = field(default=256, metadata=rule(int, ge=1))
    # Cache-aware projection: a per-engine index of the prompt prefixes each engine holds.
    prefix_cache: bool = field(default=True, metadata=rule(bool))
    prefix_chunk_bytes: int = field(default=64, metadata=rule(int, ge=8, le=4096))
    session_header: str = field(default="x-session-id", metadata=rule(str, check=header_name))


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """One served base model: its name, other names clients may send, its TTFT budget."""

    name: str = field(metadata=rule(str, required=True, check=model_name))
    aliases: tuple[str, ...] = field(
        default=(), metadata=rule(str, many=True, min_items=0, check=model_name)
    )
    ttft_budget_s: float | None = field(default=None, metadata=rule(float, optional=True, gt=0))


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """Every key of one engine entry except its name and URL (``discovery.dns.engine`` is one:
    the template applied to each discovered address)."""

    dialect: Dialect = field(default="vllm", metadata=rule(str, choices=get_args(Dialect)))
    role: EngineRole = field(default="mixed", metadata=rule(str, choices=get_args(EngineRole)))
    wave: str = field(default="default", metadata=rule(str, check=wave_name))
    max_prefill: int = field(default=256, metadata=rule(int, ge=1))
    max_decode: int = field(default=256, metadata=rule(int, ge=1))
    kv_cache_tokens: int = field(default=262144, metadata=rule(int, ge=0))
    api_key_env: str | None = field(default=None, metadata=rule(str, optional=True, check=env_name))
    weight: float = field(default=1.0, metadata=rule(float, gt=0))
    header_timeout_s: float = field(default=5.0, metadata=rule(float, gt=0))
    # After the first token, the longest the engine may stay silent before the stream counts
    # as broken (migrated when it can be, else ended); null: no per-token timeout.
    token_timeout_s: float | None = field(default=30.0, metadata=rule(float, optional=True, gt=0))
    # A stream this engine breaks may continue on another engine (docs/reliability.md).
    migrate: bool = field(default=True, metadata=rule(bool))
    models: tuple[str, ...] | None = field(
        default=None, metadata=rule(str, optional=True, many=True)
    )

    @property
    def api_key(self) -> str | None:
        """The key in the environment variable ``api_key_env``; None when unset or empty."""
        return _secret(self.api_key_env)


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig(EngineSettings):
    """One inference engine behind the router."""

    name: str = field(metadata=rule(str, required=True, check=engine_name))
    url: str = field(metadata=rule(str, required=True, check=engine_url))

    @property
    def host(self) -> str:
        """Host part of ``url`` (an IPv6 literal without its brackets)."""
        return urlsplit(self.url).hostname or ""

    @property
    def port(self) -> int:
        """Port part of ``url``."""
        return urlsplit(self.url).port or 0


@dataclass(frozen=True, slots=True)
class Health:
    """Engine probing, the monitoring-degraded threshold and the outlier-ejection cap."""

    interval_s: float = field(default=1.0, metadata=rule(float, gt=0))
    timeout_s: float = field(default=1.0, metadata=rule(float, gt=0))
    failures_to_evict: int = field(default=3, metadata=rule(int, ge=1))
    successes_to_restore: int = field(default=2, metadata=rule(int, ge=1))
    monitoring_stale_s: float = field(default=10.0, metadata=rule(float, gt=0))
    max_ejected_percent: int = field(default=50, metadata=rule(int, ge=0, le=100))


@dataclass(frozen=True, slots=True)
class Lease:
    """The HA lease store: none, or Redis."""

    backend: LeaseBackend = field(
        default="none", metadata=rule(str, choices=get_args(LeaseBackend))
    )
    url: str | None = field(default=None, metadata=rule(str, optional=True, check=lease_url))
    key: str = field(default="narwhal:lease", metadata=rule(str))
    ttl_s: float = field(default=5.0, metadata=rule(float, gt=0))


@dataclass(frozen=True, slots=True)
class HA:
    """High availability: this instance's starting role and its lease."""

    role: HARole = field(default="active", metadata=rule(str, choices=get_args(HARole)))
    lease: Lease = field(default_factory=Lease, metadata=rule(Lease))


@dataclass(frozen=True, slots=True)
class Admin:
    """Admin routes: on only while the named environment variable holds a token."""

    token_env: str | None = field(default=None, metadata=rule(str, optional=True, check=env_name))

    @property
    def token(self) -> str | None:
        """The bearer token; None (admin routes off) when the variable is unset or empty."""
        return _secret(self.token_env)


@dataclass(frozen=True, slots=True)
class Auth:
    """Client API keys: on when ``api_keys_env`` names a variable of comma-separated keys."""

    api_keys_env: str | None = field(
        default=None, metadata=rule(str, optional=True, check=env_name)
    )

    @property
    def api_keys(self) -> tuple[str, ...] | None:
        """None: client auth off. Otherwise the keys; empty (refuse every request) when the
        variable is unset or empty, so a missing secret fails closed."""
        if self.api_keys_env is None:
            return None
        raw = os.environ.get(self.api_keys_env, "")
        return tuple(key.strip() for key in raw.split(",") if key.strip())


@dataclass(frozen=True, slots=True)
class Tracing:
    """OpenTelemetry traces (the extra ``narwhal[otel]``): on when ``otlp_endpoint`` is set."""

    otlp_endpoint: str | None = field(
        default=None, metadata=rule(str, optional=True, check=otlp_url)
    )
    service_name: str = field(default="narwhal", metadata=rule(str))
    sample_ratio: float = field(default=1.0, metadata=rule(float, ge=0, le=1))


@dataclass(frozen=True, slots=True)
class Logging:
    """The access log (one line per finished request) and the format of log lines."""

    access_log: bool = field(default=False, metadata=rule(bool))
    format: LogFormat = field(default="text", metadata=rule(str, choices=get_args(LogFormat)))
    access_log_file: str | None = field(default=None, metadata=rule(str, optional=True))


@dataclass(frozen=True, slots=True)
class Cluster:
    """Several active routers sharing one fleet through Redis (docs/operations.md)."""

    backend: ClusterBackend = field(
        default="none", metadata=rule(str, choices=get_args(ClusterBackend))
    )
    url: str | None = field(default=None, metadata=rule(str, optional=True, check=lease_url))
    key_prefix: str = field(default="narwhal", metadata=rule(str))
    sync_interval_ms: int = field(default=100, metadata=rule(int, ge=10, le=60000))


@dataclass(frozen=True, slots=True)
class DnsDiscovery:
    """Engines from the A/AAAA records of a name (a Kubernetes headless Service)."""

    name: str = field(metadata=rule(str, required=True))
    port: int = field(default=8000, metadata=rule(int, ge=1, le=65535))
    interval_s: float = field(default=5.0, metadata=rule(float, gt=0))
    # host:port of a DNS server to ask instead of the system's resolver.
    resolver: str | None = field(default=None, metadata=rule(str, optional=True))
    engine: EngineSettings = field(default_factory=EngineSettings,
                                   metadata=rule(EngineSettings))


@dataclass(frozen=True, slots=True)
class Discovery:
    """Fleet membership kept elsewhere: a watched file of engine entries, or DNS."""

    file: str | None = field(default=None, metadata=rule(str, optional=True))
    interval_s: float = field(default=2.0, metadata=rule(float, gt=0))
    dns: DnsDiscovery | None = field(default=None, metadata=rule(DnsDiscovery, optional=True))

    @property
    def enabled(self) -> bool:
        return self.file is not None or self.dns is not None


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration."""

    model: str | None = field(
        default=None, metadata=rule(str, required=True, alternative="models", check=model_name)
    )
    models: tuple[ModelConfig, ...] = field(default=(), metadata=rule(ModelConfig, many=True))
    listen: Listen = field(default_factory=Listen, metadata=rule(Listen))
    serving: Serving = field(default_factory=Serving, metadata=rule(Serving))
    admission: Admission = field(default_factory=Admission, metadata=rule(Admission))
    scheduling: Scheduling = field(default_factory=Scheduling, metadata=rule(Scheduling))
    engines: tuple[EngineConfig, ...] = field(
        default=(), metadata=rule(EngineConfig, required=True, many=True, max_items=MAX_ENGINES,
                                  min_items=1, alternative="discovery")
    )
    health: Health = field(default_factory=Health, metadata=rule(Health))
    ha: HA = field(default_factory=HA, metadata=rule(HA))
    admin: Admin = field(default_factory=Admin, metadata=rule(Admin))
    auth: Auth = field(default_factory=Auth, metadata=rule(Auth))
    tokenizer: str | None = field(default=None, metadata=rule(str, optional=True))
    state_file: str | None = field(default=None, metadata=rule(str, optional=True))
    tracing: Tracing = field(default_factory=Tracing, metadata=rule(Tracing))
    logging: Logging = field(default_factory=Logging, metadata=rule(Logging))
    cluster: Cluster = field(default_factory=Cluster, metadata=rule(Cluster))
    discovery: Discovery = field(default_factory=Discovery, metadata=rule(Discovery))

    @property
    def served_models(self) -> tuple[ModelConfig, ...]:
        """The configured base models: ``models``, or the one ``model`` on every engine."""
        if self.models:
            return self.models
        return (ModelConfig(self.model or ""),)

    @property
    def default_model(self) -> str:
        """The first configured model's name (the one ``model``, or ``models[0].name``)."""
        return self.served_models[0].name

    def missing_secrets(self) -> tuple[str, ...]:
        """Engine key variables the file names but the environment leaves unset or empty."""
        missing = tuple(
            f"engines[{i}].api_key_env: {e.api_key_env} is unset or empty"
            for i, e in enumerate(self.engines)
            if e.api_key_env is not None and e.api_key is None
        )
        if self.auth.api_keys == ():
            missing += (
                f"auth.api_keys_env: {self.auth.api_keys_env} is unset or empty; "
                "every request to a protected route is refused (401)",
            )
        return missing
