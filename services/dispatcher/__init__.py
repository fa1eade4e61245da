"""The front door: validates stage requests, picks an engine (Algorithm 1), enqueues and streams back."""
