"""A CUDA process that holds GPU memory, for the GPU check: run by a throwaway user as a script
(`python worker.py --cuda auto --mib 256`), or imported by the claimant's script after
`claim()`. Standard library only: PyTorch or CuPy when the user's Python has them, else
`cuInit`/`cuCtxCreate`/`cuMemAlloc` straight from `libcuda.so.1` with ctypes (which needs
nothing but the driver). `--libcuda` names another library (the tests' fake one).

It prints one line, `ready <pid> <backend> <CUDA_VISIBLE_DEVICES>`, once the memory is held,
then holds it until its standard input closes (or it is killed)."""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
from typing import Any

BACKENDS = ("auto", "torch", "cupy", "libcuda")


class CudaFailed(Exception):
    """CUDA could not be started or memory not allocated; the message says where."""


def _libcuda(path: str, mib: int) -> list[Any]:
    """A context on device 0 (of those visible) and `mib` MiB in it, through the driver API."""
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        raise CudaFailed(f"cannot load {path}: {exc}") from None

    def call(name: str, *args: Any) -> None:
        function = getattr(lib, f"{name}_v2", None) or getattr(lib, name)
        status = function(*args)
        if status != 0:
            raise CudaFailed(f"{name} returned CUDA error {status}")

    call("cuInit", ctypes.c_uint(0))
    device, context, pointer = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    call("cuDeviceGet", ctypes.byref(device), ctypes.c_int(0))
    call("cuCtxCreate", ctypes.byref(context), ctypes.c_uint(0), device)
    call("cuMemAlloc", ctypes.byref(pointer), ctypes.c_size_t(mib << 20))
    return [lib, context, pointer]


def hold(backend: str, libcuda: str, mib: int) -> tuple[str, list[Any]]:
    """Hold `mib` MiB on the first visible GPU: (the backend used, what keeps it held)."""
    if backend in ("auto", "torch"):
        try:
            import torch  # type: ignore

            return "torch", [torch.empty(mib << 20, dtype=torch.uint8, device="cuda:0")]
        except ImportError:
            if backend == "torch":
                raise CudaFailed("PyTorch is not installed") from None
    if backend in ("auto", "cupy"):
        try:
            import cupy  # type: ignore

            return "cupy", [cupy.empty(mib << 20, dtype=cupy.uint8)]
        except ImportError:
            if backend == "cupy":
                raise CudaFailed("CuPy is not installed") from None
    return "libcuda", _libcuda(libcuda, mib)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="worker.py")
    parser.add_argument("--cuda", choices=BACKENDS, default="auto")
    parser.add_argument("--libcuda", default="libcuda.so.1")
    parser.add_argument("--mib", type=int, default=256)
    options = parser.parse_args(argv)
    try:
        backend, held = hold(options.cuda, options.libcuda, options.mib)
    except Exception as exc:  # a CUDA error of any backend: say it, in one line
        print(f"failed {type(exc).__name__}: {exc}", flush=True)
        return 1
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "-")
    print(f"ready {os.getpid()} {backend} {visible}", flush=True)
    sys.stdin.read()  # until the checker closes it
    del held
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
