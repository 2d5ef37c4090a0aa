"""The queue's torch-free side, shared by the web tier and the workers: Redis keys, job states,
signed result parts, heartbeats and the reaper of abandoned jobs."""
