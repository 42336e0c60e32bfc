"""Disaggregation tests: one torch thread, so parallel jobs on two cores stay fast."""

import torch

torch.set_num_threads(1)
