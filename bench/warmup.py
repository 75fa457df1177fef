"""Brings the GPU to its sustained clocks before the first timed kernel. After idling, the first
~second of full load runs at boost clocks (on an H200, cuDNN timed first after an idle spell
ran 7-11 % faster than at the same shape in the middle of a benchmark run), which would favour
whichever kernel a script times first."""
import time

import torch


def heat(seconds=3.0):
    """Runs bf16 matrix products for `seconds` of wall time."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()
