"""Fleet membership kept elsewhere: a watched file of engine entries, or the addresses behind
a DNS name. Each source reads on its interval and hands the whole list it found to
``FleetControl.discovered_engines``, which applies it as a reload of the engine list (an
unchanged list changes nothing; a source that fails to read changes nothing)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from narwhal.config import ConfigError, DnsDiscovery
from narwhal.config import Discovery as DiscoveryConfig
from narwhal.config.loader import config_data, load_config_data
from narwhal.tasks import stop_task

log = logging.getLogger("narwhal.discovery")
STOP_WAIT_S = 1.0
"""How long stopping waits for each discovery loop after cancelling it."""


class Sink(Protocol):
    def discovered_engines(self, entries: Sequence[Mapping[str, Any]], source: str) -> bool: ...


def dns_engine_name(address: str) -> str:
    """An engine name for an address: an IPv4 address as it is, an IPv6 one with its colons
    as dashes (names appear in URLs and metric labels)."""
    return address.replace(":", "-")


def dns_entries(config: DnsDiscovery, addresses: Sequence[str]) -> list[dict[str, Any]]:
    """One engine entry per address, sorted, with the template's keys."""
    template = config_data(config.engine)
    out = []
    ordered = sorted({ipaddress.ip_address(a) for a in addresses}, key=lambda a: (a.version, a))
    for address in map(str, ordered):
        host = f"[{address}]" if ":" in address else address
        out.append({**template, "name": dns_engine_name(address),
                    "url": f"http://{host}:{config.port}"})
    return out


def file_entries(path: str) -> list[Any]:
    """The engine entries of a discovery file: a YAML list (an empty file: none). Raises
    ConfigError when it cannot be read or is not a list."""
    data = load_config_data(path)
    if data is None:
        return []
    if not isinstance(data, list):
        raise ConfigError(path, [("", "must be a YAML list of engine entries, "
                                      f"got {type(data).__name__}")])
    return data


async def resolve(config: DnsDiscovery) -> list[str]:
    """The A and AAAA addresses of ``config.name``: from ``config.resolver`` (host:port)
    when set (dnspython), else from the system's resolver. Raises OSError on failure."""
    if config.resolver is None:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(config.name, config.port, type=socket.SOCK_STREAM)
        return [str(info[4][0]) for info in infos]
    import dns.asyncresolver
    import dns.exception
    import dns.resolver

    host, _, port = config.resolver.rpartition(":")
    resolver = dns.asyncresolver.Resolver(configure=False)
    resolver.nameservers = [host.strip("[]")]
    resolver.port = int(port)
    resolver.lifetime = min(2.0, config.interval_s)
    addresses: list[str] = []
    answered = False
    for kind in ("A", "AAAA"):
        try:
            answer = await resolver.resolve(config.name, kind)
        except (dns.resolver.NoAnswer, dns.resolver.NXDOMAIN):
            answered = True  # the name has no records of this kind
            continue
        except dns.exception.DNSException as exc:
            raise OSError(f"DNS lookup of {config.name} ({kind}) failed: {exc}") from exc
        answered = True
        addresses += [record.to_text() for record in answer]
    if not answered:
        raise OSError(f"DNS lookup of {config.name} failed")
    return addresses


class Discovery:
    """Runs the configured sources (file, DNS) as one background task each."""

    def __init__(self, config: DiscoveryConfig, sink: Sink) -> None:
        self.config = config
        self.sink = sink
        self.entries: dict[str, list[Any]] = {}  # per source: its last good list
        self.errors = 0  # reads that failed (logged once per change of error)
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._last_error: dict[str, str] = {}
        self._refused: dict[str, list[Any]] = {}  # per source: the list the fleet refused

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.config.file is not None:
            await self._file_round(self.config.file)
            self._tasks.append(loop.create_task(self._every(self.config.interval_s,
                                                            self._file_round,
                                                            self.config.file)))
        dns = self.config.dns
        if dns is not None:
            await self._dns_round(dns)
            self._tasks.append(loop.create_task(self._every(dns.interval_s, self._dns_round,
                                                            dns)))

    async def stop(self) -> None:
        """End the discovery loops (bounded: see ``narwhal.tasks``)."""
        self._stopping = True
        for task in self._tasks:
            if not await stop_task(task, STOP_WAIT_S):
                log.warning("discovery task did not stop within %.1f s of its cancellation; "
                            "left behind", STOP_WAIT_S)
        self._tasks.clear()

    async def _every(self, interval_s: float, round_: Any, arg: Any) -> None:
        while not self._stopping:  # also ends a loop whose cancellation a round swallowed
            await asyncio.sleep(interval_s)
            try:
                await round_(arg)
            except asyncio.CancelledError:
                raise
            except Exception:  # a discovery round must never stop discovery
                log.exception("discovery round failed")

    async def _file_round(self, path: str) -> None:
        try:
            found = file_entries(path)
        except ConfigError as exc:
            self._failed("file", str(exc))
            return
        self._found("file", found, f"discovery file {os.path.basename(path)}")

    async def _dns_round(self, config: DnsDiscovery) -> None:
        try:
            addresses = await resolve(config)
        except OSError as exc:
            self._failed("dns", str(exc))
            return
        self._found("dns", dns_entries(config, addresses), f"DNS discovery of {config.name}")

    def _found(self, source: str, found: list[Any], what: str) -> None:
        self._last_error.pop(source, None)
        if self.entries.get(source) == found or self._refused.get(source) == found:
            return  # unchanged, or refused as it is (logged then)
        merged = [entry for key in ("file", "dns")
                  for entry in (found if key == source else self.entries.get(key, ()))]
        if self.sink.discovered_engines(merged, what):
            self.entries[source] = found
            self._refused.pop(source, None)
            log.warning("%s: %d engines", what, len(found))
        else:
            self._refused[source] = found

    def _failed(self, source: str, message: str) -> None:
        self.errors += 1
        if self._last_error.get(source) != message:
            self._last_error[source] = message
            log.error("discovery (%s) changed nothing: %s", source, message)
