"""Speculative decoding on the executor: verifying proposed tokens in the batched forward."""
