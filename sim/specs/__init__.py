"""Model and GPU specifications as data, and the memory vLLM keeps out of the KV pool."""
