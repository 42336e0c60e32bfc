"""Shared test settings: keep torch to one thread so parallel CI jobs on 2 cores stay fast."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
