"""`python -m flashjit`: what the package sees — its version, the library it loaded and each
backend's devices (flashjit.info()), and where the kernel cache lives."""
import sys

from . import Context, FlashjitError, info


def main():
    i = info()
    print(f"flashjit {i['version']}  ({i['library']})")
    for backend, devices in i["backends"].items():
        print(f"backend {backend}: {len(devices)} device{'s' if len(devices) != 1 else ''}")
        for n, d in enumerate(devices):
            print(f"  device {n}: {d['name']}, {d['compute_units']} compute units, "
                  f"{d['memory_gib']} GiB, arch {d['arch']}, driver {d['driver']}")
    try:
        print(f"cache: {Context().cache_path}")
    except FlashjitError as e:
        print(f"no usable device: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
