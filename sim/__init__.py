"""Simulator core: requests, KV block manager, scheduler, engine step, SimPy loop, cost models, metrics."""
