"""Narwhal learning: latency model, profiling, TPOT, drift, output length."""

from narwhal.learning.model import Learning

__all__ = ["Learning"]
