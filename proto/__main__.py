"""`python -m kvfleet.proto`: regenerate the gRPC code from the .proto files."""

from .cli import regenerate

raise SystemExit(regenerate())
