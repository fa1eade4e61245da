"""The worker: one process per engine; pulls from the engine's Redis queue only while the engine has room."""
