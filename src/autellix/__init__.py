"""Autellix: a serving system that schedules LLM agent programs, not single calls."""

__version__ = "0.1.0"
