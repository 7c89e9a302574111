"""Print pip constraints pinning every dependency of pyproject.toml to its lower bound.

``python .ci/floors.py > floors.txt`` turns each ``name>=X`` of ``[project] dependencies``
and of every extra into ``name==X``, so that CI installs (and so tests) exactly the oldest
versions the package claims to support. A requirement without a lower bound is an error.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

LOWER = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*>=\s*([^,;\s]+)")


def floors(pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    requirements = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    pins: dict[str, str] = {}
    for requirement in requirements:
        if requirement.startswith(project["name"] + "["):
            continue  # an extra of this package, pinned through its own entries
        match = LOWER.match(requirement)
        if match is None:
            sys.exit(f"floors: no lower bound in {requirement!r}")
        pins[match.group(1).lower()] = match.group(3)
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[1]
    print("\n".join(floors(root / "pyproject.toml")))
