"""Chimera's overhead and CPU: through the stack against the engine directly, at GPU rates, engine set-up, tools."""
