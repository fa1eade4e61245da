"""The ``chimera`` command: the operator's entry point."""
