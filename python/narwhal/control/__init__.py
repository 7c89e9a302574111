"""Changing the running router: reload, engines added and removed, discovery."""
