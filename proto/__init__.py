"""gRPC contracts (.proto) and the Python code generated from them."""
