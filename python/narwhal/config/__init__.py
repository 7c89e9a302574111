"""Narwhal's configuration: one YAML file parsed into typed, frozen, validated sections."""

from narwhal.config.loader import demo_config, load_config, parse_config
from narwhal.config.schema import MAX_ENGINES, ConfigError
from narwhal.config.sections import (
    DEMO_MODEL,
    HA,
    Admin,
    Admission,
    AdmissionMode,
    Config,
    Dialect,
    EngineConfig,
    EngineRole,
    HARole,
    Health,
    Lease,
    LeaseBackend,
    Listen,
    PlacementPolicy,
    Scheduling,
    Serving,
)

__all__ = [
    "DEMO_MODEL",
    "HA",
    "MAX_ENGINES",
    "Admin",
    "Admission",
    "AdmissionMode",
    "Config",
    "ConfigError",
    "Dialect",
    "EngineConfig",
    "EngineRole",
    "HARole",
    "Health",
    "Lease",
    "LeaseBackend",
    "Listen",
    "PlacementPolicy",
    "Scheduling",
    "Serving",
    "demo_config",
    "load_config",
    "parse_config",
]
