"""Attention over the paged KV cache: the backends and the forward batch they read."""
