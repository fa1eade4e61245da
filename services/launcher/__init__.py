"""`chimera up`: the local mirror of compose.yaml — Redis, router, predictor, dispatcher and one worker per
engine as supervised child processes."""
