"""Front-door load on simulated engines: stages/s, dispatch time, CPU per stage, open streams, overload."""
