"""Faults and soak: one fault per fresh stack, random faults for minutes, and a Redis Cluster master killed."""
