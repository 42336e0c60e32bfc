"""Trace replay: read agent traces, drive a target with them, and measure prefix reuse.

Readers turn the trace formats into `Conversation`s of `Turn`s; the driver replays them as
concurrent sessions against a `Target`; measures and the report summarise the request records.
"""
