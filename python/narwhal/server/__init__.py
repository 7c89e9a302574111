"""Narwhal server."""
