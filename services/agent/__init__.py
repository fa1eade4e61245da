"""A tool-using coding agent: the workload, demo and benchmark of agent loops through Chimera."""
