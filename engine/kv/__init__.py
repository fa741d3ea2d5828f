"""The paged KV cache: blocks, hashes, the per-request block tables, the host tier and swaps, the prefix cache's admin side, the memory budget."""
