"""Peer-router tests: one torch thread; sim-backend ranks need no model weights."""

import torch

torch.set_num_threads(1)
