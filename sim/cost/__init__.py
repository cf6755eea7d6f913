"""Step pricing: the fitted GPU model, the roofline, a model calibrated on the executor."""
