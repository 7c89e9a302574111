"""Narwhal admission."""
