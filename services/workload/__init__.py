"""The workload: a prompt corpus built from real problems, the paper's workflows, and a seeded outcome model.

The demo client, the benchmarks and the trace generator all draw from here, so they share one definition of
what a task, a workflow stage and a model's outcome are.
"""
