"""Disaggregated serving: context ranks prefill and hand a request's KV to generation ranks;
the same transport moves a conversation's prefix to a rank its turn moved to.

| file | job |
|---|---|
| `blocks.py` | `KVBlock` records; reading and writing page bytes of the paged KV cache |
| `holds.py` | context side: requests parked after prefill, waiting for their KV to be pulled |
| `context_side.py` | context side: park after the first token, export blocks, expire holds |
| `generation_side.py` | generation side: reserve pages, fetch blocks, install, keep decoding |
| `transport_types.py` | `FetchRequest`, `HandoffTransport`, `TransportContext`, `TransportError` |
| `transports.py` | `HANDOFF_TRANSPORTS` registry: `grpc` (direct pull), `disk` (shared disk tier) |
| `grpc_pull.py` | the `PullKvBlocks` server half and the `grpc` transport's client half |
| `prefix_pull.py` | a moved turn's new rank pulls the prefix its home has, and holds it |
| `prefix_export.py` | a moved turn's home sends the blocks of the prompt's prefix it holds |
| `page_io.py` | page bytes of a rank: real ones, or none on a `sim` rank |
| `disk_handoff.py` | the `disk` transport: blocks through the shared disk tier's files |
| `roles.py` | `ROLE_HOOKS` registry: what an engine core does per role (`both`, `context`, ...) |
| `metrics.py` | hand-off bytes, seconds, blocks skipped |
"""
