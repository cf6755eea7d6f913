"""Load clients: replay a trace against an OpenAI-compatible server and probe its step times."""
