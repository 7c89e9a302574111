"""Packaging: ``narwhal --version``, the stable-ABI core, dependency bounds, and Redis as an
extra (the core runs without it; a Redis lease without it fails at start naming the extra).

Each check runs against the installed package: CI runs this file in fresh virtual
environments where narwhal was installed from the wheel, first without the ``redis`` extra.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

import narwhal
from narwhal import _narwhal_fast

# Runs ``narwhal.cli`` in a child interpreter in which ``import redis`` fails as it does when
# the extra is not installed (a None entry in sys.modules makes the import system refuse it).
WITHOUT_REDIS = "import sys; sys.modules['redis'] = None; "


def run(argv: list[str], code: str = "", timeout: float = 60) -> subprocess.CompletedProcess[str]:
    prelude = code + "from narwhal.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", "import sys; " + prelude, *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_version_names_the_package_the_rust_core_and_the_build_profile() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "narwhal", "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    package = importlib.metadata.version("narwhal")
    assert _narwhal_fast.BUILD_PROFILE in ("release", "debug")
    assert done.stdout.startswith(
        f"narwhal {package} (Rust core {_narwhal_fast.__version__}, "
        f"{_narwhal_fast.BUILD_PROFILE} build; "
    ), done.stdout
    # one version for the distribution, the Python package and the Rust crate
    assert narwhal.__version__ == package == _narwhal_fast.__version__


def test_the_rust_core_is_the_stable_abi_build() -> None:
    # cp310-abi3: the one extension every CPython >= 3.10 loads (a per-version build left in
    # the source tree would shadow it)
    assert Path(_narwhal_fast.__file__).name == "_narwhal_fast.abi3.so"


def test_every_dependency_has_a_lower_bound_and_redis_is_only_an_extra() -> None:
    requirements = [Requirement(r) for r in importlib.metadata.requires("narwhal") or []]
    assert requirements
    for req in requirements:
        if req.name == "narwhal":  # the test extra pulls in narwhal[redis]
            assert req.extras == {"redis"} and not req.specifier, req
            continue
        assert any(spec.operator == ">=" for spec in req.specifier), f"no lower bound: {req}"
    redis = [r for r in requirements if r.name == "redis"]
    assert [str(r.marker) for r in redis] == ['extra == "redis"']
    core = {r.name for r in requirements if r.marker is None}
    assert core == {"uvloop", "httptools", "orjson", "prometheus-client", "pyyaml", "dnspython"}


def test_every_module_imports_without_the_redis_client() -> None:
    code = (
        WITHOUT_REDIS
        + "import importlib, pkgutil, narwhal\n"
        + "names = [m.name for m in pkgutil.walk_packages(narwhal.__path__, 'narwhal.')\n"
        + "         if not m.name.endswith('__main__')]\n"
        + "for name in names: importlib.import_module(name)\n"
        + "print(len(names))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 20  # the walk found the package's modules


def test_a_redis_lease_without_the_client_fails_at_start_naming_the_extra(
    tmp_path: Path,
) -> None:
    config = tmp_path / "narwhal.yaml"
    config.write_text(
        "model: m\n"
        "engines: [{name: a0, url: 'http://127.0.0.1:9'}]\n"
        "ha: {role: active, lease: {backend: redis, url: 'redis://127.0.0.1:9/0'}}\n"
    )
    done = run(["serve", "--config", str(config), "--port", "0"], code=WITHOUT_REDIS)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "ha.lease.backend is 'redis'" in done.stderr
    assert "pip install 'narwhal[redis]'" in done.stderr
    assert "Traceback" not in done.stderr
    assert "serving" not in done.stdout
