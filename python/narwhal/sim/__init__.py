"""Narwhal sim."""
