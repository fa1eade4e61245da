"""Queue visibility for operators: what each engine will serve next, and why a request is where it is.

Everything here reads Redis only, with the keys of ``services.common.keys`` (the same ones the README
gives for ``redis-cli``), so it works against a live stack without touching any service.
"""
