"""What the forward benchmarks share: the grid's shapes, the FLOP count, and a warm-up."""
import time

import torch


def grid_shape(s, d):
    """Batch and heads of a grid point: b * s = 16384 tokens, hidden 2048 (FlashAttention's
    benchmark)."""
    return max(1, 16384 // s), 2048 // d


def tflops(b, h, s, d, causal, ms):
    """TFLOP/s as FlashAttention counts them: 4 * b * h * s^2 * d, halved when causal."""
    return 4 * b * h * s * s * d / (2 if causal else 1) / ms / 1e9


def heat(seconds=3.0):
    """Brings the GPU to its sustained clocks before the first timed kernel: runs bf16 matrix
    products for `seconds` of wall time. After idling, the first ~second of full load runs at
    boost clocks (on an H200, cuDNN timed first after an idle spell ran 7-11 % faster than at
    the same shape in the middle of a benchmark run), which would favour whichever kernel a
    script times first."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()
