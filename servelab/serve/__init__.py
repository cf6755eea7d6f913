"""Serving: an OpenAI-compatible HTTP server on the engine and a trace-replay load client."""
