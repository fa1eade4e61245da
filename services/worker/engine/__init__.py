"""Engines behind one small interface: simulated (profile-driven), vLLM in-process, remote OpenAI server."""
