"""Workloads: request traces (real and synthetic), loaders, generators, transforms."""
