"""Narwhal's PEP 517 build backend: maturin, with wheels on x86_64 glibc Linux linked by zig.

maturin's own backend tags a wheel ``linux_x86_64`` (it passes ``--compatibility off``) and
links against the build host's glibc, and ``[tool.maturin]`` has no ``zig`` key. This wrapper
makes every standard build (``pip wheel .``, ``pip install .``, a build from the sdist) pass
``--zig --compatibility <tool.maturin.compatibility>`` instead, with the ``ziglang`` package
from PyPI as a build requirement, so each of them yields the manylinux2014 (glibc 2.17)
wheel that CI tests and ``auditwheel show`` accepts.

Explicit maturin arguments (``--config-settings maturin.build-args=...`` or
``MATURIN_PEP517_ARGS``) are passed through untouched; editable installs, sdists and other
platforms are maturin's own.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from typing import Any

import maturin
from maturin import (
    build_editable,
    build_sdist,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]

# The zig that the CI wheel was built and tested with (its ABI to glibc 2.17 is zig's).
ZIGLANG = "ziglang>=0.17.1,<0.18"

# maturin warns when build-backend is not literally "maturin"; here it is maturin.
os.environ.setdefault("MATURIN_NO_MISSING_BUILD_BACKEND_WARNING", "1")


def _links_with_zig(config_settings: Mapping[str, Any] | None) -> bool:
    """Whether this wheel build is the manylinux one: no explicit maturin arguments, and an
    x86_64 glibc Linux host (the platform CI builds and tests)."""
    if config_settings and ({"maturin.build-args", "build-args"} & set(config_settings)):
        return False
    if os.environ.get("MATURIN_PEP517_ARGS"):
        return False
    return (
        sys.platform == "linux"
        and platform.machine() == "x86_64"
        and platform.libc_ver()[0] == "glibc"
    )


def get_requires_for_build_wheel(config_settings: Mapping[str, Any] | None = None) -> list[str]:
    requires: list[str] = list(maturin.get_requires_for_build_wheel(config_settings))
    return [*requires, ZIGLANG] if _links_with_zig(config_settings) else requires


def build_wheel(
    wheel_directory: str,
    config_settings: Mapping[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    if _links_with_zig(config_settings):
        compatibility = str(maturin.get_config().get("compatibility", "manylinux2014"))
        args = f"--zig --compatibility {compatibility}"
        config_settings = {**(config_settings or {}), "maturin.build-args": args}
        # cargo-zigbuild runs `python3 -m ziglang`: make it this build environment's Python.
        os.environ.setdefault("CARGO_ZIGBUILD_PYTHON_PATH", sys.executable)
    name: str = maturin.build_wheel(wheel_directory, config_settings, metadata_directory)
    return name
