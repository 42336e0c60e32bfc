"""Engine tests: one torch thread, so that parallel jobs on two cores stay fast."""

import torch

torch.set_num_threads(1)
