"""Benchmarks: each writes its results under ``bench/results/`` (JSON and a Markdown summary)."""
