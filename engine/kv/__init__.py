"""The paged KV cache: blocks, hashes, the per-request block tables, the host tier and swaps, the store tier, the memory budget (the prefix cache's admin side is engine/prefix_cache_admin.py)."""
