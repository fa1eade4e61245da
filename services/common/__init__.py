"""Shared pieces: Redis key schema, queue scripts, typed contracts, config and process helpers."""
