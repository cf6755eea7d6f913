"""The event-driven replay of one engine: the SimPy loop, metrics and verdicts."""
