"""The router and engine services, and the kvfleet command."""
