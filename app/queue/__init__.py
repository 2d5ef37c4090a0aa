"""Redis side of the service: the web tier's backend, worker heartbeats, abandoned-job reaping.

Plain Redis and RQ only: nothing here imports torch.
"""
