"""``python -m narwhal.sim``: run one simulated engine."""

from __future__ import annotations

import argparse
import sys

from narwhal.sim import cli


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="narwhal sim", description=cli.DESCRIPTION)
    cli.add_arguments(parser)
    return cli.run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
