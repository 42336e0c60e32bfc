"""The router: conversation pins, strict affinity with bounded deferral, forwarding to ranks.

The admission core (`admission`, `policies`, `store`) knows nothing of gRPC and runs on an
injected clock, so a fleet simulator can drive the same code.
"""
