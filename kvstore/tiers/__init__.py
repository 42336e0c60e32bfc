"""KV tiers under the device pools: host memory and a disk directory shared by engine pods."""
