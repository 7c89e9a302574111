"""Narwhal learning."""
