"""Typed stubs for the Rust extension narwhal._narwhal_fast (checked with mypy.stubtest)."""

__version__: str
