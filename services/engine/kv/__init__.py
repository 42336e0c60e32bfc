"""The device KV cache: paged tensors, the model's view of the tiers, sizing and fp8 scales."""
