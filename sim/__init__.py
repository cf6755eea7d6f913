"""Simulator core: requests, KV blocks, scheduler, engine step, SimPy loop, cost models."""
