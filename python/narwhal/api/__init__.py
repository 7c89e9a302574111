"""Narwhal api."""
