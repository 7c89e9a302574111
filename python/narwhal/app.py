"""The composition root: builds every part of one router process once, hands each its
collaborators, and runs their lifecycle (start, drain, stop)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

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
from narwhal.config import Config
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


def build_engines(config: Config, catalog: Catalog | None = None) -> list[Engine]:
    """One :class:`Engine` per configured engine, each with its own connection pool."""
    engines = []
    for index, engine_config in enumerate(config.engines):
        headers: list[tuple[bytes, bytes]] = []
        if engine_config.api_key:
            headers.append((b"authorization", f"Bearer {engine_config.api_key}".encode()))
        model = catalog.first_model(index) if catalog is not None else config.default_model
        engines.append(Engine(index, engine_config, EngineClient(engine_config.url,
                                                                 headers=headers), model))
    return engines


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
                 worker_wake: tuple[int, list[int]] | None = None) -> None:
        self.config = config
        self.board = board
        self.catalog = catalog = Catalog(config)
        self.model_boards = boards = model_boards(config, board)
        self.engines = engines = build_engines(config, catalog)
        self.learning = learning = Learning(engines, config, shared_path=board.path)
        self.scheduler = scheduler = Scheduler(
            engines, board, learning, policy=config.scheduling.policy,
            predictive=config.admission.mode == "predictive",
            prefix_chars=config.scheduling.affinity_prefix_chars,
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
            self.shared_admin = shared = SharedAdmin(
                f"{board.path}.admin.json", state, notify_peers=lambda: wake.notify_admin())
            wake = WorkerWake(asyncio.get_running_loop(), worker_wake[0], worker_wake[1],
                              queue.kick, shared.apply)
            queue.notify_peers = wake.notify
            self.wake = wake
        self.lifecycle = Lifecycle()
        registry = build_registry(
            board, lambda: [e.name for e in engines], extra=self._metric_families,
            models=[] if boards is None else [
                (m.name, b) for m, b in zip(config.models, boards, strict=True)])
        self.observer = make_observer(config)
        self.flow = CompletionFlow(
            config, board,
            sizing=sizing or make_sizing(config.admission.sizing, engines, config.tokenizer),
            predictive=PredictiveAdmission(config.admission, learning, scheduler),
            scheduler=scheduler, queue=queue, learning=learning, observer=self.observer,
            state_refusal=state.refusal, names=catalog.names, model_boards=boards,
        )
        info = InfoRoutes(catalog, board, engines, learning, registry, self.lifecycle,
                          state_refusal=state.refusal, eligible=scheduler.eligible)
        keys = config.auth.api_keys
        self.router = Router(
            self.flow, info,
            AdminApi(config.admin.token, state, engines, self.shared_admin),
            ClientAuth(keys) if keys is not None else None,
        )

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        await self.health.probe_all()
        self.health.start()
        await self.state.start()
        await self.learning.start()
        self.lifecycle.started = True

    def drain(self) -> None:
        """SIGTERM: ``/ready`` says draining, and a held HA lease goes to the standby now."""
        self.lifecycle.draining = True
        self.state.step_down()

    async def stop(self) -> None:
        await self.learning.stop()
        await self.state.stop()
        await self.health.stop()
        if self.wake is not None:
            self.wake.close()
        await asyncio.gather(*(e.client.close() for e in self.engines))
        if self.observer is not None:
            await self.observer.close()

    # -- wiring ------------------------------------------------------------------------------
    def _engine_changed(self, engine: Engine) -> None:
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
