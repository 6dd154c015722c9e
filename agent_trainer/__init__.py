"""Shared infrastructure for agent-trainer: cache paths, tracking, config schemas, CLI helpers."""

__version__ = "0.1.0"
