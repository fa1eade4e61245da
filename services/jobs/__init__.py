"""Background jobs (Celery), off the hot path: trace export, retraining, engine profiling."""
