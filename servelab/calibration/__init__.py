"""Calibration and validation: fit the cost model to profiled executor steps, and check the
simulator against measured runs of the same trace."""
