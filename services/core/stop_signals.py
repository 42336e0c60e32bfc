"""How a kvfleet process (engine, router, `kvfleet up`) learns it should stop."""

from __future__ import annotations

import signal
import threading


def stop_on_signals() -> threading.Event:
    """An event that SIGINT and SIGTERM set. Call it before anything serves: a SIGTERM that
    comes once a port answers but before the start-up ends must stop the process gracefully,
    not kill it with the default handler."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    return stop
