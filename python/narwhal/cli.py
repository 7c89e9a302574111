"""Command line: ``narwhal serve``, ``narwhal sim`` and ``narwhal --version``."""

from __future__ import annotations

import argparse
import dataclasses
import platform
import subprocess
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from narwhal import __version__


def version_line() -> str:
    """``narwhal --version``: the package, its Rust core and the core's build profile."""
    from narwhal import _narwhal_fast as core

    return (
        f"narwhal {__version__} (Rust core {core.__version__}, {core.BUILD_PROFILE} build; "
        f"{platform.python_implementation()} {platform.python_version()})"
    )


class _Version(argparse.Action):
    """Like argparse's version action, but loads the Rust core only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> NoReturn:
        print(version_line())
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    from narwhal.sim import cli as sim_cli

    parser = argparse.ArgumentParser(prog="narwhal", description=__doc__)
    parser.add_argument(
        "--version", action=_Version, help="the package, Rust core and build profile"
    )
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the router")
    source = serve.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="YAML configuration file")
    source.add_argument(
        "--demo", action="store_true", help="run in front of simulated engines, no file needed"
    )
    serve.add_argument("--host", help="override listen.host")
    serve.add_argument("--port", type=int, help="override listen.port")
    serve.add_argument("--workers", type=int, default=1, help="worker processes on one port")
    serve.add_argument("--demo-engines", type=int, default=2, help=argparse.SUPPRESS)
    serve.add_argument("--log-level", default="warning")
    serve.add_argument("--log-format", choices=("text", "json"),
                       help="the router's own log lines (default: logging.format, text)")

    sim = commands.add_parser("sim", help="run a simulated vLLM engine")
    sim_cli.add_arguments(sim)
    return parser


DEMO_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _serve(args: argparse.Namespace) -> int:
    from narwhal.config import Config, ConfigError, Listen, demo_config, load_config
    from narwhal.fleet.ha import MissingExtra, check_backend
    from narwhal.observe import TracingUnavailable, check_tracing
    from narwhal.observe.logs import setup_logging
    from narwhal.serve import serve, start_demo_engines, stop_processes


    setup_logging(args.log_level, args.log_format or "text")
    procs: list[subprocess.Popen[str]] = []
    extra = ""
    try:
        if args.demo:
            procs, urls = start_demo_engines(DEMO_MODEL, args.demo_engines)
            config = demo_config(urls, model=DEMO_MODEL)
            extra = f"; demo engines: {' '.join(urls)}"
        else:
            config = load_config(args.config)
        check_backend(config.ha.lease)
    except (ConfigError, OSError, MissingExtra) as exc:
        print(f"narwhal: {exc}", file=sys.stderr)
        stop_processes(procs)
        return 2
    try:
        check_tracing(config.tracing)
    except TracingUnavailable as exc:
        print(f"narwhal: {exc}", file=sys.stderr)
        stop_processes(procs)
        return 2
    if args.log_format is None and config.logging.format != "text":
        setup_logging(args.log_level, config.logging.format)
    for name in config.missing_secrets():
        print(f"narwhal: warning: {name}", file=sys.stderr)
    def overrides(loaded: Config) -> Config:
        """The command line's --host and --port over a configuration (the file's, and the
        file's again at every reload)."""
        if args.host is None and args.port is None:
            return loaded
        listen = Listen(
            host=args.host if args.host is not None else loaded.listen.host,
            port=args.port if args.port is not None else loaded.listen.port,
        )
        return dataclasses.replace(loaded, listen=listen)

    config = overrides(config)
    try:
        return serve(config, workers=args.workers, extra=extra,
                     config_path=None if args.demo else args.config, overrides=overrides)
    finally:
        stop_processes(procs)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    from narwhal.sim import cli as sim_cli

    return sim_cli.run(args)


if __name__ == "__main__":
    sys.exit(main())
