"""Synthetic traces: length distributions, arrival processes, shapes and the spec grammar."""
