"""The KV cache manager: paged blocks, prefix matching, life cycles, reuse policies, tiers."""
