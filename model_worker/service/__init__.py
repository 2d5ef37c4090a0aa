"""Serving requests: job functions, the RQ worker and its job policy, the in-process engine and
queue/ (torch-free keys, result parts, reaper). Calls the methods; no method imports service/."""
