"""Faults and soak: one fault per fresh stack, random faults for minutes, a Redis Cluster master killed."""
