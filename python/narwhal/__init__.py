"""Narwhal: a low-overhead router in front of OpenAI-compatible LLM inference engines."""

__version__ = "0.1.0"
