"""What the forward benchmarks share: the grid's shapes, the FLOP count, the warm-up and the
timing; and where their results go."""
import json
import os
import re
import time

import torch
from triton.testing import do_bench


def grid_shape(s, d):
    """Batch and heads of a grid point: b * s = 16384 tokens, hidden 2048 (FlashAttention's
    benchmark)."""
    return max(1, 16384 // s), 2048 // d


def tflops(b, h, s, d, causal, ms):
    """TFLOP/s as FlashAttention counts them: 4 * b * h * s^2 * d, halved when causal."""
    return 4 * b * h * s * s * d / (2 if causal else 1) / ms / 1e9


def start(lib, cache=":memory:"):
    """What a benchmark does first: seeds torch, brings the GPU to its sustained clocks (heat)
    and returns a flashjit.Context on CUDA with the library at lib and the kernel cache at
    cache."""
    import flashjit  # the caller put the package on sys.path

    torch.manual_seed(0)
    heat()
    return flashjit.Context(backend="cuda", lib=lib, cache_path=cache)


def heat(seconds=3.0):
    """Brings the GPU to its sustained clocks before the first timed kernel: runs bf16 matrix
    products for `seconds` of wall time."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


def sustained_ms(fn, warm_s=1.0, windows=9, window_s=0.1):
    """Milliseconds per call of fn in the GPU's steady state under fn's own load: fn runs back
    to back for warm_s seconds, then `windows` consecutive windows of about window_s each are
    timed with CUDA events (no gap between them); the median of the windows' means.

    Why not a short burst (do_bench's 100 ms): the H200 here runs attention kernels at its
    700 W power cap, where the SM clock settles between about 1.5 and 1.95 GHz by kernel,
    against 1.98 GHz for the first fraction of a second after any idle spell (a JIT compile, a
    tensor allocation, a cuDNN plan). A burst timed right after such a spell ran up to 15 %
    faster than the same kernel timed in the steady state, so the peer comparison depended on
    which kernel a script happened to time after a gap (bench/RESULTS.md)."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    calls, batch = 0, 1
    while True:  # warm, and learn the time per call; batches of at most ~50 ms
        for _ in range(batch):
            fn()
        torch.cuda.synchronize()
        calls += batch
        elapsed = time.perf_counter() - start
        if elapsed >= warm_s:
            break
        batch = max(1, min(2 * batch, int(0.05 * calls / elapsed)))
    n = max(1, int(window_s * calls / elapsed))
    events = [torch.cuda.Event(enable_timing=True) for _ in range(windows + 1)]
    events[0].record()
    for w in range(windows):
        for _ in range(n):
            fn()
        events[w + 1].record()
    torch.cuda.synchronize()
    means = sorted(events[w].elapsed_time(events[w + 1]) / n for w in range(windows))
    return means[windows // 2]


def add_timing_args(ap):
    """The timing options every benchmark takes: --timing and --reps (see time_ms)."""
    ap.add_argument("--timing", default="sustained", choices=["sustained", "burst"],
                    help="sustained: the steady state under each kernel's own load; burst: do_bench")
    ap.add_argument("--reps", type=int, default=100, help="burst timing: do_bench rep time in ms")


def time_ms(fn, how, reps=100):
    """Milliseconds per call of fn: `sustained` (sustained_ms) or `burst` (do_bench's median
    over reps milliseconds, after 25 ms of warm-up)."""
    if how == "sustained":
        return sustained_ms(fn)
    return do_bench(fn, warmup=25, rep=reps, return_mode="median")


def read_bandwidth(how, reps=100):
    """GB/s of summing a 4 GiB bf16 tensor, timed as time_ms(how, reps): the ceiling a
    memory-bound kernel (a decode) can approach."""
    x = torch.empty(2 * 1024**3, device="cuda", dtype=torch.bfloat16).normal_()
    ms = time_ms(lambda: x.sum(dtype=torch.float32), how, reps)
    del x
    return 4 * 1024**3 / ms / 1e6


def to_pages(x, page, perm):
    """x [b, s, h, d] as a paged cache [b * pages, page, h, d] (pages = ceil(s / page)): page i
    of sequence j at perm[j * pages + i], zeros past s; perm an int32 permutation of the pages
    on x's device, whose view [b, pages] is the page table."""
    b, s, h, d = x.shape
    pages = -(-s // page)
    padded = torch.zeros(b, pages * page, h, d, device=x.device, dtype=x.dtype)
    padded[:, :s] = x
    out = torch.empty(b * pages, page, h, d, device=x.device, dtype=x.dtype)
    out[perm.long()] = padded.view(b * pages, page, h, d)
    return out


def save_results(out_dir, name, payload):
    """Writes payload as JSON to out_dir/NAME[_CONFIG][_N].json (out_dir made if missing) and
    returns the path: CONFIG is FLASHJIT_CONFIG's value where it is set (made fit for a file
    name), N the first count from 2 that names no file there yet, so that several runs into
    one folder each keep their own."""
    config = os.environ.get("FLASHJIT_CONFIG", "")
    safe = re.sub(r"[^A-Za-z0-9.-]+", "_", config.replace("=", "-"))
    stem = name + ("_" + safe if config else "")
    path, n = os.path.join(out_dir, stem + ".json"), 2
    while os.path.exists(path):
        path, n = os.path.join(out_dir, f"{stem}_{n}.json"), n + 1
    os.makedirs(out_dir, exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
    return path
