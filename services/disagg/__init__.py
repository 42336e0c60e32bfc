"""Disaggregated serving: context ranks prefill and hand a request's KV to generation ranks.

| file | job |
|---|---|
| `blocks.py` | `KVBlock` records; reading and writing page bytes of the paged KV cache |
| `holds.py` | context side: requests parked after prefill, waiting for their KV to be pulled |
| `context_side.py` | context side: park after the first token, export blocks, expire holds |
| `generation_side.py` | generation side: reserve pages, fetch blocks, install, keep decoding |
| `transport_types.py` | `FetchRequest`, `HandoffTransport`, `TransportContext`, `TransportError` |
| `transports.py` | `HANDOFF_TRANSPORTS` registry: `grpc` (direct pull), `disk` (shared disk tier) |
| `grpc_pull.py` | the `PullKvBlocks` server half and the `grpc` transport's client half |
| `disk_handoff.py` | the `disk` transport: blocks through the shared disk tier's files |
| `roles.py` | `ROLE_HOOKS` registry: what an engine core does per role (`both`, `context`, ...) |
| `metrics.py` | hand-off bytes, seconds, blocks skipped |
"""
