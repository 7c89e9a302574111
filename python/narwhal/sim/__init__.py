"""Narwhal's vLLM-dialect engine simulator (``narwhal sim``)."""

from narwhal.sim.server import Simulator
from narwhal.sim.settings import OutputLength, SimSettings

__all__ = ["OutputLength", "SimSettings", "Simulator"]
