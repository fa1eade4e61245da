"""Chimera: latency- and quality-aware serving for multi-agent LLM workflows on a heterogeneous pool."""
