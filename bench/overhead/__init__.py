"""Chimera's overhead and CPU: against the engine directly, at GPU rates, engine set-up, tool calls."""
