"""One engine rank as a process: its gRPC service, router link, HTTP ports, `kvfleet engine`."""
