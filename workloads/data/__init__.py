"""Bundled traces, read through importlib.resources (see README.md for sources and licenses)."""
