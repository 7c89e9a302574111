"""Narwhal fleet."""
