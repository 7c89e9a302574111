"""``narwhal sim`` command line: flags, start-up line and signal handling."""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import signal
import sys

import uvloop

from narwhal.sim.server import Simulator
from narwhal.sim.settings import DEFAULT_MODEL, ROLES, OutputLength, SimSettings

DESCRIPTION = "Simulated vLLM engine: vLLM 0.32 wire format, batch timing model, faults."
_PR_SET_PDEATHSIG = 1


def _output_len(text: str) -> str:
    try:
        OutputLength(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the simulator's flags to ``parser``."""
    d = SimSettings()
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port (0 = pick a free one)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"served model ({DEFAULT_MODEL})")
    parser.add_argument("--served-model-name", action="extend", nargs="+", default=[],
                        metavar="NAME",
                        help="as vLLM: the names the model is served under (repeatable; the "
                             "first is the name answers carry); default: --model")
    parser.add_argument("--lora", action="append", default=[], metavar="NAME[=PATH]",
                        help="a LoRA adapter loaded at start (repeatable), listed on "
                             "/v1/models with parent = the first served name; more are "
                             "loaded and unloaded at run time with POST "
                             "/v1/load_lora_adapter and /v1/unload_lora_adapter")
    parser.add_argument("--prefill-tokens-per-s", type=float, default=d.prefill_tokens_per_s,
                        help="prefill rate, prompt tokens per second")
    parser.add_argument("--prefill-overhead-ms", type=float, default=d.prefill_overhead_ms,
                        help="fixed time added to every prefill")
    parser.add_argument("--tpot-ms", type=float, default=d.tpot_ms,
                        help="decode step time with one running request")
    parser.add_argument("--tpot-growth-ms", type=float, default=d.tpot_growth_ms,
                        help="added to the step time per extra running request")
    parser.add_argument("--output-len", type=_output_len, default=d.output_len,
                        help="output length: N, uniform:LO:HI or geometric:MEAN "
                             "(capped by max_tokens)")
    parser.add_argument("--max-model-len", type=int, default=d.max_model_len,
                        help="context window; longer requests get vLLM's 400")
    parser.add_argument("--kv-cache-tokens", type=int, default=d.kv_cache_tokens,
                        help="prefix cache capacity in tokens, as vLLM's automatic prefix "
                             "caching (16-token blocks, LRU eviction; prefill time only for "
                             "uncached tokens); 0 (default): no prefix cache")
    parser.add_argument("--enable-prompt-tokens-details", action="store_true",
                        help="as vLLM: usage carries prompt_tokens_details.cached_tokens")
    parser.add_argument("--role", choices=ROLES, default="mixed",
                        help="disaggregation role: prefill serves NIXL prefill legs "
                             "(non-streaming) and normal requests; decode requires "
                             "kv_transfer_params with do_remote_prefill and skips the prefill")
    parser.add_argument("--seed", type=int, default=0, help="seed of all pseudo-random choices")
    parser.add_argument("--keepalive-timeout-s", type=float, default=d.keepalive_timeout_s,
                        help="close idle keep-alive connections after this long (uvicorn: 5)")
    parser.add_argument("--api-key", default=None,
                        help="as vLLM's --api-key: /v1 routes need 'Authorization: Bearer KEY' "
                             "(else 401)")
    parser.add_argument("--exit-with-parent", action="store_true",
                        help="exit when the parent process dies (for test and demo harnesses)")


def _exit_with_parent() -> None:
    """Ask Linux to send SIGTERM when the parent dies, so a crashed harness leaks nothing."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the parent poll in _serve still works
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        raise SystemExit(0)


def _loras(specs: list[str]) -> dict[str, str]:
    loras: dict[str, str] = {}
    for spec in specs:
        name, _, path = spec.partition("=")
        if not name:
            raise ValueError(f"--lora {spec!r}: give NAME or NAME=PATH")
        loras[name] = path or f"/adapters/{name}"
    return loras


def settings_from(args: argparse.Namespace) -> SimSettings:
    return SimSettings(
        model=args.model, served_names=tuple(args.served_model_name), loras=_loras(args.lora),
        prefill_tokens_per_s=args.prefill_tokens_per_s,
        prefill_overhead_ms=args.prefill_overhead_ms, tpot_ms=args.tpot_ms,
        tpot_growth_ms=args.tpot_growth_ms, output_len=args.output_len,
        max_model_len=args.max_model_len, kv_cache_tokens=args.kv_cache_tokens,
        prompt_tokens_details=args.enable_prompt_tokens_details, role=args.role, seed=args.seed,
        keepalive_timeout_s=args.keepalive_timeout_s, api_key=args.api_key,
    )


async def _serve(settings: SimSettings, host: str, port: int, watch_parent: bool) -> None:
    sim = Simulator(settings)
    bound = await sim.start(host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if watch_parent:
        parent = os.getppid()

        def check() -> None:
            if os.getppid() != parent:
                stop.set()
            else:
                loop.call_later(1.0, check)

        loop.call_later(1.0, check)
    shown = f"[{host}]" if ":" in host else host
    print(f"narwhal-sim listening on http://{shown}:{bound}", flush=True)
    try:
        await stop.wait()
    finally:
        await sim.stop()


def run(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT; return the exit status."""
    try:
        settings = settings_from(args)
    except ValueError as exc:
        print(f"narwhal sim: {exc}", file=sys.stderr)
        return 2
    try:
        if args.exit_with_parent:
            _exit_with_parent()
        uvloop.run(_serve(settings, args.host, args.port, args.exit_with_parent))
    except OSError as exc:
        print(f"narwhal sim: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0
