"""Verifiers: is a model's answer right? HumanEval tests and LeetCode cases run in a sandboxed child
interpreter (``sandbox.py``), numeric answers of the math sets matched (``numeric.py``); ``answers.py`` reads
each corpus problem's check from the corpus wheels, ``verifier.py`` is the entry point."""
