"""The gateway: OpenAI-compatible, stateful sessions, program-aware routing."""
