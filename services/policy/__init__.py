"""The policy kernel: pure functions that pick an engine and order its queue (see README.md here).

Nothing here touches Redis, gRPC or a clock; the dispatcher, the benchmark simulator and the inspector all
decide through these modules.
"""
