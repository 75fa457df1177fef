"""What the PyTorch test scripts share: the skip without torch (exit 77, on import), the device
and dtype they run in (CUDA in bfloat16, else CPU tensors in float32), each check printed as ok
or FAIL and counted, and the FlashAttention error criterion. Imported first by
tests/torch_api.py and tests/torch_trace.py (their folder is on sys.path when they run)."""
import sys

try:
    import torch
except ImportError:
    print("SKIP: no torch")
    sys.exit(77)

dev = "cuda" if torch.cuda.is_available() else "cpu"
dtype = torch.bfloat16 if dev == "cuda" else torch.float32
failures = 0


def check(name, ok, detail=""):
    """Prints the verdict; a failed one is counted (exit_status)."""
    global failures
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}", flush=True)


def within(name, got, ref64, plain):
    """got's error against the float64 reference no worse than twice the plain
    implementation's (in the inputs' dtype), plus a rounding of the largest output."""
    err = (got.double() - ref64).abs().max().item()
    plain_err = (plain.double() - ref64).abs().max().item()
    atol = 2 * torch.finfo(got.dtype).eps * ref64.abs().max().item()
    check(name, err <= 2 * plain_err + atol, f"err {err:.3g}, plain {plain_err:.3g}")


def exit_status():
    """The process's exit status: 1 where a check failed."""
    return 1 if failures else 0
