"""The discrete-event simulator running the product's policy code, its sweeps, and the live replay."""
