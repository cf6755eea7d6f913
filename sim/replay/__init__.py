"""The event-driven replay of one engine: the SimPy loop, quiet runs, metrics and verdicts."""
