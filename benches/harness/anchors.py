"""The anchor routers from PyPI in their own venv, started as anchors-measured.md describes.

vllm-router and sglang-router (Rust) and the LiteLLM proxy (Python), pinned to the versions
the reference figures were measured with, bound to 127.0.0.1 with offline settings. A
package that cannot be installed is reported and its row stays "not measured".
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import loadgen
from .systems import MODEL, Proc, System, free_port

MASTER_KEY = "sk-narwhal-bench"


@dataclass(frozen=True)
class Anchor:
    name: str
    requirement: str  # pip requirement
    module: str  # importable when installed
    start: Callable[[Path, Sequence[str], Path], tuple[Proc, list[loadgen.Target]]]


def _venv_bin(venv: Path, name: str) -> str:
    return str(venv / "bin" / name)


def _vllm_router(
    venv: Path, engines: Sequence[str], logdir: Path
) -> tuple[Proc, list[loadgen.Target]]:
    port = free_port()
    proc = Proc(
        "vllm-router",
        [
            _venv_bin(venv, "vllm-router"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--worker-urls",
            *engines,
            "--policy",
            "round_robin",
            "--prometheus-port",
            str(free_port()),
        ],
        logdir / "vllm-router.log",
    )
    return proc, [loadgen.Target(f"http://127.0.0.1:{port}")]


def _sglang_router(
    venv: Path, engines: Sequence[str], logdir: Path
) -> tuple[Proc, list[loadgen.Target]]:
    port = free_port()
    proc = Proc(
        "sglang-router",
        [
            _venv_bin(venv, "python"),
            "-m",
            "sglang_router.launch_router",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--worker-urls",
            *engines,
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(free_port()),
        ],
        logdir / "sglang-router.log",
    )
    return proc, [loadgen.Target(f"http://127.0.0.1:{port}")]


def _litellm(venv: Path, engines: Sequence[str], logdir: Path) -> tuple[Proc, list[loadgen.Target]]:
    port = free_port()
    config = {
        "model_list": [
            {
                "model_name": MODEL,
                "litellm_params": {
                    "model": f"openai/{MODEL}",
                    "api_base": f"{url}/v1",
                    "api_key": "none",
                },
            }
            for url in engines
        ]
    }
    path = logdir / "litellm.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {
        "LITELLM_MASTER_KEY": MASTER_KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        # Offline: without it LiteLLM retries a Hugging Face tokenizer download on every
        # request (llama-3 model names) before falling back to its bundled tiktoken.
        "HF_HUB_OFFLINE": "1",
        "NO_DOCS": "True",
    }
    proc = Proc(
        "litellm",
        [
            _venv_bin(venv, "litellm"),
            "--config",
            str(path),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        logdir / "litellm.log",
        env=env,
    )
    target = loadgen.Target(
        f"http://127.0.0.1:{port}", (("Authorization", f"Bearer {MASTER_KEY}"),)
    )
    return proc, [target]


ANCHORS = (
    Anchor("vllm-router", "vllm-router==0.1.17", "vllm_router", _vllm_router),
    Anchor("sglang-router", "sglang-router==0.3.2", "sglang_router", _sglang_router),
    Anchor("litellm", "litellm[proxy]==1.108.7", "litellm", _litellm),
)


def _has(venv: Path, anchor: Anchor) -> str | None:
    """The installed version, or None."""
    dist = anchor.requirement.split("[")[0].split("=")[0]
    probe = subprocess.run(
        [
            _venv_bin(venv, "python"),
            "-c",
            f"import importlib.metadata as m; print(m.version({dist!r}))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return probe.stdout.strip() if probe.returncode == 0 else None


def ensure_venv(venv: Path, log: Callable[[str], None]) -> dict[str, str]:
    """Create ``venv`` and install each anchor; name -> version, or "not measured: <why>"."""
    status: dict[str, str] = {}
    if not (venv / "bin" / "python").exists():
        log(f"creating venv {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    for anchor in ANCHORS:
        version = _has(venv, anchor)
        if version is None:
            log(f"installing {anchor.requirement} into {venv} (PyPI)")
            done = subprocess.run(
                [
                    _venv_bin(venv, "python"),
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--disable-pip-version-check",
                    anchor.requirement,
                ],
                capture_output=True,
                text=True,
                timeout=1800,
            )
            version = _has(venv, anchor)
            if version is None:
                why = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["unknown error"]
                status[anchor.name] = (
                    f"not measured: pip install {anchor.requirement} failed ({why[0][:200]})"
                )
                continue
        status[anchor.name] = version
    return status


def start(
    anchor: Anchor,
    venv: Path,
    engines: Sequence[str],
    logdir: Path,
    probe_request: Callable[[loadgen.Target], bytes],
    timeout_s: float = 120.0,
) -> System:
    """Start ``anchor`` and wait until a streamed answer comes back through it."""
    proc, targets = anchor.start(venv, engines, logdir)
    deadline = time.monotonic() + timeout_s
    why: str | None = "not probed"
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            break
        why = asyncio.run(loadgen.probe(targets[0], probe_request(targets[0]), 10.0))
        if why is None:
            return System(anchor.name, targets, [proc])
        time.sleep(0.25)
    tail = proc.output()[-2000:]
    proc.stop()
    raise RuntimeError(f"{anchor.name} did not answer within {timeout_s:.0f} s ({why}):\n{tail}")
