"""The discrete-event simulator that runs the product's policy code, its sweeps, and the live replay that checks it."""
