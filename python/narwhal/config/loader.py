"""Turns a YAML document into a Config: the table-driven parser, cross-key checks, loading."""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, is_dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from narwhal.config.schema import ConfigError, Rule
from narwhal.config.sections import (
    DEMO_MODEL,
    Cluster,
    Config,
    DnsDiscovery,
    EngineConfig,
    Health,
    Lease,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Problems = list[tuple[str, str]]
_T = TypeVar("_T", bound="DataclassInstance")
_BAD: Any = object()  # stands for a value that failed its check (already reported)
_KIND_NAMES = {int: "an integer", float: "a number", str: "a non-empty string",
               bool: "true or false"}


# ---------------------------------------------------------------- checks across keys


def _check_lease(lease: Lease, path: str) -> Problems:
    if lease.backend == "redis" and lease.url is None:
        return [(f"{path}.url", "is required when backend is 'redis', got null")]
    if lease.backend == "none" and lease.url is not None:
        return [
            (f"{path}.url", f"is set but backend is 'none' (set backend: redis), got {lease.url!r}")
        ]
    return []


def _check_cluster(cluster: Cluster, path: str) -> Problems:
    if cluster.backend == "redis" and cluster.url is None:
        return [(f"{path}.url", "is required when backend is 'redis', got null")]
    if cluster.backend == "none" and cluster.url is not None:
        return [(f"{path}.url",
                 f"is set but backend is 'none' (set backend: redis), got {cluster.url!r}")]
    return []


def _check_dns(dns: DnsDiscovery, path: str) -> Problems:
    if dns.resolver is None:
        return []
    host, sep, port = dns.resolver.rpartition(":")
    if sep and host and port.isdigit() and 0 < int(port) < 65536:
        return []
    return [(f"{path}.resolver", f"must be host:port, got {dns.resolver!r}")]


def _check_health(health: Health, path: str) -> Problems:
    if health.monitoring_stale_s > health.interval_s:
        return []
    text = f"must exceed {path}.interval_s ({health.interval_s:g})"
    return [(f"{path}.monitoring_stale_s", f"{text}, got {health.monitoring_stale_s:g}")]


def _check_config(config: Config, path: str) -> Problems:
    problems: Problems = []
    names: dict[str, int] = {}
    places: dict[tuple[str, int], int] = {}
    for i, engine in enumerate(config.engines):
        first = names.setdefault(engine.name, i)
        if first != i:
            text = f"duplicates engines[{first}].name, got {engine.name!r}"
            problems.append((f"engines[{i}].name", text))
        first = places.setdefault((engine.host.lower(), engine.port), i)
        if first != i:
            text = f"is the same engine as engines[{first}].url, got {engine.url!r}"
            problems.append((f"engines[{i}].url", text))
    if config.discovery.enabled:
        return problems  # the engines (and so roles and models' engines) come at run time
    roles = {engine.role for engine in config.engines}
    for have, need in (("prefill", "decode"), ("decode", "prefill")):
        if have in roles and need not in roles:
            problems.append(("engines", f"has role {have!r} engines but no role {need!r} engine"))
    return problems + _check_models(config)


def _check_models(config: Config) -> Problems:
    """``model`` or ``models``; names and aliases unique; each engine's ``models`` named; each
    model served by an engine that runs it whole, or by a prefill and decode pair."""
    if config.model is not None and config.models:
        return [("models", f"is set with model ({config.model!r}): give one or the other, "
                           f"got {len(config.models)} entries")]
    problems: Problems = []
    where: dict[str, str] = {}
    for i, model in enumerate(config.served_models):
        path = f"models[{i}]" if config.models else "model"
        for key, name in ((f"{path}.name" if config.models else path, model.name),
                          *((f"{path}.aliases[{j}]", a) for j, a in enumerate(model.aliases))):
            first = where.setdefault(name, key)
            if first != key:
                problems.append((key, f"duplicates {first}, got {name!r}"))
    names = {m.name for m in config.served_models}
    for i, engine in enumerate(config.engines):
        for j, name in enumerate(engine.models or ()):
            if name not in names:
                alias = where.get(name)
                hint = f" (an alias at {alias}: name the model)" if alias else ""
                text = f"names no configured model{hint}, got {name!r}"
                problems.append((f"engines[{i}].models[{j}]", text))
    if problems:
        return problems
    for i, model in enumerate(config.served_models):
        roles = {e.role for e in config.engines if e.models is None or model.name in e.models}
        if "mixed" in roles or {"prefill", "decode"} <= roles:
            continue
        key = f"models[{i}].name" if config.models else "model"
        text = ("no engine serves it (engines[].models)" if not roles else
                f"its engines have only role {' and '.join(sorted(roles))!s}: none runs it "
                "whole (mixed) and no prefill and decode pair does")
        problems.append((key, f"{text}, got {model.name!r}"))
    return problems


_CROSS_CHECKS: dict[type, Callable[[Any, str], Problems]] = {
    Lease: _check_lease,
    Health: _check_health,
    Cluster: _check_cluster,
    DnsDiscovery: _check_dns,
    Config: _check_config,
}


# ---------------------------------------------------------------- the table-driven parser


def _show(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    try:
        text = repr(value)
    except ValueError:  # an integer beyond Python's digit limit
        text = "<a very large number>"
    return text if len(text) <= 80 else text[:77] + "..."


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _expected(rule: Rule) -> str:
    if rule.choices:
        return "one of " + ", ".join(repr(choice) for choice in rule.choices)
    if rule.ge is not None and rule.le is not None:
        return f"{_KIND_NAMES[rule.kind]} from {rule.ge:g} to {rule.le:g}"
    bounds = [
        f">= {rule.ge:g}" if rule.ge is not None else "",
        f"> {rule.gt:g}" if rule.gt is not None else "",
        f"<= {rule.le:g}" if rule.le is not None else "",
    ]
    return " ".join([_KIND_NAMES[rule.kind], *(bound for bound in bounds if bound)])


def _fits(rule: Rule, value: object) -> bool:
    if rule.kind is bool:
        return isinstance(value, bool)
    if rule.kind is str:
        return (
            isinstance(value, str) and value != "" and (not rule.choices or value in rule.choices)
        )
    if isinstance(value, bool) or not isinstance(
        value, (float, int) if rule.kind is float else int
    ):
        return False
    if rule.kind is float:
        try:
            value = float(value)
        except OverflowError:  # an integer too large for a float
            return False
        if not math.isfinite(value):
            return False
    return not (
        (rule.ge is not None and value < rule.ge)
        or (rule.gt is not None and value <= rule.gt)
        or (rule.le is not None and value > rule.le)
    )


def _scalar(rule: Rule, value: object, path: str, problems: Problems) -> Any:
    if not _fits(rule, value):
        problems.append((path, f"must be {_expected(rule)}, got {_show(value)}"))
        return _BAD
    if rule.check is not None and isinstance(value, str) and (why := rule.check(value)):
        problems.append((path, f"{why}, got {_show(value)}"))
        return _BAD
    return float(value) if rule.kind is float else value  # type: ignore[arg-type]


def _value(rule: Rule, value: object, path: str, problems: Problems) -> Any:
    if value is None and rule.optional:
        return None
    if rule.many:
        return _list(rule, value, path, problems)
    if not is_dataclass(rule.kind):
        return _scalar(rule, value, path, problems)
    return _section(rule.kind, value, path, problems)


def _list(rule: Rule, value: object, path: str, problems: Problems) -> Any:
    """A list of sections or scalars (scalars: no two alike)."""
    if not isinstance(value, list) or len(value) < rule.min_items:
        kind = "a non-empty list" if rule.min_items else "a list"
        problems.append((path, f"must be {kind}, got {_show(value)}"))
        return _BAD
    if rule.max_items is not None and len(value) > rule.max_items:
        problems.append((path, f"must have at most {rule.max_items} entries, got {len(value)}"))
        return _BAD
    if is_dataclass(rule.kind):
        items = [_section(rule.kind, item, f"{path}[{i}]", problems)
                 for i, item in enumerate(value)]
    else:
        items = [_scalar(rule, item, f"{path}[{i}]", problems) for i, item in enumerate(value)]
        for i, item in enumerate(items):
            if item is not _BAD and items.index(item) != i:
                problems.append((f"{path}[{i}]", f"is listed twice, got {_show(item)}"))
                items[i] = _BAD
    return _BAD if any(item is _BAD for item in items) else tuple(items)


def _section(cls: type[_T], raw: object, path: str, problems: Problems) -> _T:
    """Build one section from a mapping, reporting every problem; _BAD when there is any."""
    rules: dict[str, Rule] = {f.name: f.metadata["rule"] for f in fields(cls)}
    if raw is None and not any(r.required for r in rules.values()):
        raw = {}  # a section left empty (every key commented out) takes every default
    if not isinstance(raw, Mapping):
        problems.append((path, f"must be a mapping, got {_show(raw)}"))
        return _BAD  # type: ignore[no-any-return]
    before = len(problems)
    for key in raw:
        if key not in rules:
            close = difflib.get_close_matches(str(key), list(rules), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append((_join(path, str(key)), f"unknown key{hint}, got {_show(raw[key])}"))
    kwargs: dict[str, Any] = {}
    for name, rule in rules.items():
        if name in raw:
            kwargs[name] = _value(rule, raw[name], _join(path, name), problems)
        elif rule.required and (rule.alternative is None or rule.alternative not in raw):
            problems.append((_join(path, name), "is required"))
    if len(problems) > before:
        return _BAD  # type: ignore[no-any-return]
    built = cls(**kwargs)
    check = _CROSS_CHECKS.get(cls)
    cross = check(built, path) if check else []
    problems.extend(cross)
    return _BAD if cross else built


def parse_config(data: object, *, source: str = "<config>") -> Config:
    """Validate a decoded YAML document; raise ConfigError naming every bad key and value."""
    if data is None:
        raise ConfigError(source, [("", "is empty (model and engines are required)")])
    if not isinstance(data, Mapping):
        raise ConfigError(source, [("", f"must be a mapping of keys, got {_show(data)}")])
    problems: Problems = []
    config = _section(Config, data, "", problems)
    if problems:
        raise ConfigError(source, problems)
    return config


# ---------------------------------------------------------------- YAML files and the demo


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML would silently keep the last one)."""


def _no_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[object] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", mark)
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate a YAML configuration file; every error names the file."""
    return parse_config(load_config_data(path), source=os.fspath(path))


def load_config_data(path: str | os.PathLike[str]) -> Any:
    """A YAML file's document, not yet validated (``parse_config`` does that); an unreadable
    file or invalid YAML raises ConfigError naming the file."""
    source = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as stream:
            return yaml.load(stream, Loader=_StrictLoader)
    except OSError as exc:
        raise ConfigError(source, [("", f"cannot read the file: {exc.strerror or exc}")]) from exc
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: e.g. an int beyond the digit limit
        raise ConfigError(source, [("", f"invalid YAML: {exc}")]) from exc


def parse_engine(data: object, *, source: str = "<engine>") -> EngineConfig:
    """Validate one engine entry (the keys of ``engines[]``); ConfigError names each bad key
    without a prefix (``max_decode``, not ``engines[0].max_decode``)."""
    problems: Problems = []
    engine = _section(EngineConfig, data, "", problems)
    if problems:
        raise ConfigError(source, problems)
    return engine


def demo_config(engine_urls: Sequence[str], *, port: int = 8000, model: str = DEMO_MODEL) -> Config:
    """The configuration of ``narwhal serve --demo``: one vLLM-dialect engine per URL."""
    engines = [{"name": f"sim{i}", "url": url} for i, url in enumerate(engine_urls)]
    return parse_config(
        {"model": model, "listen": {"port": port}, "engines": engines}, source="<demo>"
    )


def config_data(config: DataclassInstance) -> dict[str, Any]:
    """The document ``parse_config`` turns back into ``config`` (or a section into that
    section): every key that differs from its default, and every required key."""
    out: dict[str, Any] = {}
    for f in fields(config):
        value = getattr(config, f.name)
        rule: Rule = f.metadata["rule"]
        if is_dataclass(rule.kind):
            if rule.many:
                value = [config_data(item) for item in value]
            elif value is not None:
                value = config_data(value)
                if not value and not rule.optional:
                    continue  # a section at every default
        elif isinstance(value, tuple):
            value = list(value)
        default = (f.default_factory() if f.default_factory is not dataclasses.MISSING
                   else f.default)
        if default is not dataclasses.MISSING and not rule.required:
            if is_dataclass(default) and value == config_data(default):  # type: ignore[arg-type]
                continue
            if value == default or (isinstance(default, tuple) and value == list(default)):
                continue
        if (value is None and not rule.optional) or (rule.alternative and value == []):
            continue  # a required key left out for its alternative (model, engines)
        out[f.name] = value
    return out
