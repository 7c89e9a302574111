"""docs/reliability.md's soak table, generated from a stored soak run (the JSON that
``NARWHAL_SOAK_OUT=FILE pytest tests/e2e/test_soak.py -k "not kills"`` writes).

    python -m benches.harness.soak_report docs/soak.json --into docs/reliability.md
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .report import splice_named

# outcome class -> how the table names it
OUTCOMES = (("completed", "completed"), ("failed", "failed (engine faults)"),
            ("invalid_requests", "invalid"), ("rejected", "rejected (429)"),
            ("expired", "expired (504 and mid-stream deadline events)"),
            ("left", "clients left (cancelled)"))


def table(fig: dict[str, Any]) -> str:
    seconds = float(fig["seconds"])
    requests = int(fig["requests"])
    outcomes = fig["outcomes"]
    answers = ", ".join(f"{outcomes[key]} {label}" for key, label in OUTCOMES
                        if key in outcomes)
    rows = [
        ("soak length", f"{seconds:.0f} s"),
        ("requests", f"{requests} ({requests / seconds:.0f} a second), none lost: every class "
                     "moved by exactly what the clients saw"),
        ("answers", answers),
        ("invariant scrapes", f"{fig['scrapes']}, no violation; gauges 0 at the end"),
        ("router RSS", f"{fig['rss_start_mib']} MiB at start, {fig['rss_after_warmup_mib']} MiB "
                       f"after the warm-up, {fig['rss_end_mib']} MiB at the end, "
                       f"{fig['rss_max_mib']} MiB peak"),
        ("router descriptors (less pooled engine sockets)",
         f"{fig['client_fds_start']} at start, {fig['client_fds_max']} at most under load, "
         f"{fig['client_fds_end']} once idle"),
    ]
    run = (f"The stored run: `{fig['command']}` at commit `{fig['commit']}`.\n\n"
           if "command" in fig else "")
    return run + "\n".join(["| figure | value |", "|---|---|",
                            *(f"| {name} | {value} |" for name, value in rows)])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benches.harness.soak_report",
                                description=__doc__.splitlines()[0])
    p.add_argument("figures", type=Path, help="the soak's JSON (NARWHAL_SOAK_OUT)")
    p.add_argument("--into", type=Path, required=True, help="the Markdown file to splice into")
    args = p.parse_args(argv)
    fig = json.loads(args.figures.read_text())
    command = "python -m benches.harness.soak_report " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    # The host's load now says nothing of the soak's; the stored run is named in the body.
    splice_named(args.into, "soak", command, table(fig), with_load=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
