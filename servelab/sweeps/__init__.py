"""Sweeps over policies, rates and scheduler limits, and the capacity search on top of them."""
