"""Narwhal scheduling."""
