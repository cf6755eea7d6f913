"""Executor: a PyTorch Llama-family transformer with paged KV, driven by the sim scheduler."""
