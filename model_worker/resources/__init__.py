"""Memory, devices, threads and caches an engine process shares between requests: allocator,
device memory and branches, thread counts, the factored-unembedding cache. Imports common/ only."""
