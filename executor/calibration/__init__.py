"""Calibrating the executor: profiling its steps into a cost model (fit), measuring runs and
simulating them under that model (validation), with measured runs interleaved against the
machine's drift (interleave)."""
