"""Narwhal upstream."""
