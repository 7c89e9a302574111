"""The composition root: builds every part of one router process once, hands each its
collaborators, and runs their lifecycle (start, drain, stop)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from prometheus_client.metrics_core import Metric

from narwhal._narwhal_fast import Board
from narwhal.admission.calibration import Sizing, make_sizing
from narwhal.admission.gate import AdmissionQueue
from narwhal.admission.predictive import PredictiveAdmission
from narwhal.admission.wake import WorkerWake
from narwhal.api.admin import AdminApi
from narwhal.api.auth import ClientAuth
from narwhal.api.info import InfoRoutes, Lifecycle
from narwhal.api.metrics import build_registry, token_accounting_family
from narwhal.api.router import Router
from narwhal.cluster.admin import ADMIN_DOC, ClusterAdmin
from narwhal.cluster.sync import ClusterSync
from narwhal.config import Config, EngineConfig
from narwhal.control.discovery import Discovery
from narwhal.control.fleet import FLEET_DOC, ChangeRefused, FleetControl, Parts
from narwhal.control.store import FileStore, MemoryStore
from narwhal.fleet.engine import Engine
from narwhal.fleet.health import HealthMonitor
from narwhal.fleet.outlier import metric_families as outlier_families
from narwhal.fleet.shared_admin import SharedAdmin
from narwhal.fleet.state import RouterState
from narwhal.flow.completion import CompletionFlow
from narwhal.learning import Learning
from narwhal.observe import make_observer
from narwhal.request.models import Card, Catalog
from narwhal.scheduling.placement import Scheduler
from narwhal.upstream.client import EngineClient

log = logging.getLogger("narwhal")


def make_engine(slot: int, config: EngineConfig, model: str) -> Engine:
    """One :class:`Engine` in board slot ``slot``, with its own connection pool."""
    headers: list[tuple[bytes, bytes]] = []
    if config.api_key:
        headers.append((b"authorization", f"Bearer {config.api_key}".encode()))
    return Engine(slot, config, EngineClient(config.url, headers=headers), model)


def build_engines(config: Config, catalog: Catalog | None = None) -> list[Engine]:
    """One :class:`Engine` per configured engine, in slots 0..n-1."""
    return [make_engine(index, engine_config, catalog.first_model(index)
                        if catalog is not None else config.default_model)
            for index, engine_config in enumerate(config.engines)]


def model_board_paths(config: Config, path: str) -> list[str]:
    """The shared files of the per-model boards beside the main board's ``path`` (one per
    configured model when the configuration uses ``models``, else none)."""
    return [f"{path}.model{i}" for i in range(len(config.models))]


def model_boards(config: Config, board: Board) -> list[Board] | None:
    """Each configured model's board (per-model metrics), private or attached to the files
    the parent made (:func:`model_board_paths`) beside the shared main board; None when the
    configuration names one ``model``."""
    if not config.models:
        return None
    if board.path is None:
        return [Board(engines=1) for _ in config.models]
    return [Board(engines=1, path=path, create=False)
            for path in model_board_paths(config, board.path)]


class Narwhal:
    """One router process: the HTTP application (``router``) and everything behind it.

    ``worker_wake``: with several worker processes on one port, this worker's wake pipe and
    its peers' (``(read_fd, peer_fds)``); the admin state is then shared through a file
    beside the shared board.
    """

    def __init__(self, config: Config, board: Board, *, sizing: Sizing | None = None,
                 worker_wake: tuple[int, list[int]] | None = None,
                 config_path: str | None = None, leader: bool = True,
                 overrides: Callable[[Config], Config] | None = None) -> None:
        """``config_path``: the file ``config`` came from (reload re-reads it, and applies
        ``overrides``: the command line's); ``leader``: this process runs the fleet's
        discovery (one worker of several does)."""
        self.config = config
        self.leader = leader
        self.board = board
        self.catalog = catalog = Catalog(config)
        self.model_boards = boards = model_boards(config, board)
        self.engines = engines = build_engines(config, catalog)
        self.learning = learning = Learning(engines, config, shared_path=board.path)
        # Several routers sharing the fleet through Redis: engine quotas, load, admin state.
        self.cluster = cluster = None if config.cluster.backend != "redis" else ClusterSync(
            config.cluster, engines, board, learning,
            on_grow=lambda: self.queue.capacity_freed())
        self.scheduler = scheduler = Scheduler(
            engines, board, learning, policy=config.scheduling.policy,
            predictive=config.admission.mode == "predictive",
            prefix_chars=config.scheduling.affinity_prefix_chars,
            limits=None if cluster is None else cluster.limits,
            peers=None if cluster is None else cluster.peers,
        )
        self.queue = queue = AdmissionQueue(
            scheduler, config.admission.queue_limit, config.admission.max_wait_s
        )
        self.health = HealthMonitor(engines, config.health, self._engine_changed,
                                    self._engine_models)
        self.state = state = RouterState(config, engines, self.health)
        learning.on_profiled = self._engine_changed
        self.shared_admin: SharedAdmin | None = None
        self.wake: WorkerWake | None = None
        if worker_wake is not None and board.path is not None:
            self.shared_admin = SharedAdmin(
                f"{board.path}.admin.json", state, notify_peers=lambda: wake.notify_admin())
            wake = WorkerWake(asyncio.get_running_loop(), worker_wake[0], worker_wake[1],
                              queue.kick, self._peer_changed)
            queue.notify_peers = wake.notify
            self.wake = wake
        if cluster is not None:
            self.shared_admin = shared = ClusterAdmin(self.shared_admin, state, cluster.publish)
            cluster.subscribe(ADMIN_DOC, lambda _kind, doc: shared.received(doc))
            cluster.share_profiles(learning.supervisor)
        self.lifecycle = Lifecycle()
        registry = build_registry(
            board, lambda: self.control.slot_names(), extra=self._metric_families,
            models=[] if boards is None else [
                (m.name, b) for m, b in zip(config.models, boards, strict=True)])
        self.observer = make_observer(config)
        self.flow = CompletionFlow(
            config, board,
            sizing=sizing or make_sizing(config.admission.sizing, engines, config.tokenizer),
            predictive=(predictive := PredictiveAdmission(config.admission, learning,
                                                          scheduler)),
            scheduler=scheduler, queue=queue, learning=learning, observer=self.observer,
            state_refusal=state.refusal, names=catalog.names, model_boards=boards,
        )
        self.control = control = self._fleet_control(config, config_path, predictive,
                                                     overrides)
        self.discovery = Discovery(config.discovery, control) if leader else None
        if cluster is not None:  # engines added or removed through one router reach all
            control.share(lambda doc: cluster.publish(FLEET_DOC, doc))
            cluster.subscribe(FLEET_DOC, lambda _kind, doc: control.received(doc))
        info = InfoRoutes(catalog, board, engines, learning, registry, self.lifecycle,
                          state_refusal=state.refusal, eligible=scheduler.eligible,
                          leaving=control.leaving, cluster=cluster)
        keys = config.auth.api_keys
        self.router = Router(
            self.flow, info,
            AdminApi(config.admin.token, state, engines, self.shared_admin, control),
            ClientAuth(keys) if keys is not None else None,
        )

    def _fleet_control(self, config: Config, config_path: str | None,
                       predictive: PredictiveAdmission,
                       overrides: Callable[[Config], Config] | None) -> FleetControl:
        first = FleetControl.first_document(config)
        board = self.board
        store: MemoryStore | FileStore
        if self.wake is not None and board.path is not None:
            store = FileStore(f"{board.path}.fleet.json", first)
        else:
            store = MemoryStore(first)
        parts = Parts(board=board, catalog=self.catalog, learning=self.learning,
                      health=self.health, state=self.state, scheduler=self.scheduler,
                      queue=self.queue, predictive=predictive, flow=self.flow,
                      make_engine=self._make_engine)
        wake = self.wake
        control = FleetControl(config, self.engines, parts, store, config_path=config_path,
                               notify_peers=None if wake is None else wake.notify_admin,
                               overrides=overrides)
        control.apply(store.read())
        return control

    def _make_engine(self, slot: int, config: EngineConfig) -> Engine:
        return make_engine(slot, config, self.catalog.first_model(slot))

    def _peer_changed(self) -> None:
        """Another worker changed the admin state or the fleet: take both."""
        if self.shared_admin is not None:
            self.shared_admin.apply()
        self.control.sync()

    def reload(self) -> None:
        """SIGHUP: reload the configuration file; a refused reload is logged."""
        try:
            self.control.reload()
        except ChangeRefused as exc:
            log.error("reload refused: %s", exc.message)

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        if self.cluster is not None:  # first: profiles and admin state come from the others
            await self.cluster.start()
        await self.health.probe_all()
        self.health.start()
        await self.state.start()
        await self.learning.start()
        if self.discovery is not None:
            await self.discovery.start()
        self.lifecycle.started = True

    def drain(self) -> None:
        """SIGTERM: ``/ready`` says draining, and a held HA lease goes to the standby now."""
        self.lifecycle.draining = True
        self.state.step_down()

    async def stop(self) -> None:
        if self.discovery is not None:
            await self.discovery.stop()
        await self.control.stop()
        await self.learning.stop()
        await self.state.stop()
        await self.health.stop()
        if self.cluster is not None:
            await self.cluster.stop()
        if self.wake is not None:
            self.wake.close()
        await asyncio.gather(*(e.client.close() for e in self.engines))
        if self.observer is not None:
            await self.observer.close()

    # -- wiring ------------------------------------------------------------------------------
    def _engine_changed(self, engine: Engine) -> None:
        self.control.engine_changed(engine)
        self.board.set_engine_up(engine.index, engine.serves())
        self.learning.engine_changed(engine)
        if engine.serves():
            self.queue.kick()

    def _engine_models(self, engine: Engine, cards: list[Card]) -> None:
        """A probe read the engine's served names: adapters it loaded become routable to it,
        and requests waiting for one may now be placed."""
        if self.catalog.engine_reported(engine.index, cards):
            self.queue.kick()

    def _metric_families(self) -> Iterable[Metric]:
        yield token_accounting_family(self.engines)
        yield from outlier_families(self.engines)
        yield from self.learning.metric_families()
        yield from self.flow.migrations.metric_families()
        if self.cluster is not None:
            yield from self.cluster.metric_families()
