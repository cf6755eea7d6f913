"""`servelab route`: an HTTP router in front of OpenAI-compatible upstreams, with health checks."""
