"""`python -m bench.gpucheck [--out DIR] [--nvidia-smi CMD] [--libcuda PATH] [--cuda BACKEND]`:
Patroller on a real GPU host, end to end, as root.

It runs `patroller doctor`; captures `nvidia-smi -q -x` (serials zeroed), `-L`, and ten
seconds of `dmon -s pucvmet` and `pmon -s um`, named after the driver and the GPU, for
tests/fixtures/nvsmi/real/; reads them with the project's parsers; starts Patroller on the
real nvidia-smi; has two throwaway users (useradd) each start a CUDA process (PyTorch or CuPy
where their Python has them, else cuInit/cuCtxCreate/cuMemAlloc from libcuda.so.1 through
ctypes) and checks that /status shows each on its GPU as its user's, with its memory, within
5 s; has a third user's script claim() a GPU, hold memory on it, and checks that the GPU
granted shows that process and `claimed`; releases everything and checks the GPU is free again;
removes the users and stops the daemon whatever happened. One table at the end; the captures,
the doctor's answer, the daemon's log and result.json in the output folder ($OUT, or --out, or
./gpucheck-<time>). Exit status 0 when every step passed, 1 when one failed, 2 when it cannot
run (not root).

The nvidia-smi command and the CUDA library are options, so that the tests run the whole check
against the simulator with a fake libcuda (tests/test_gpucheck.py)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from bench.gpucheck.check import Check
from bench.gpucheck.worker import BACKENDS


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def table(check: Check) -> str:
    rows = [("step", "result", "seconds", "detail")] + [
        (
            s.name,
            "ok" if s.ok else "not run" if s.ok is None else "FAILED",
            f"{s.seconds:.2f}",
            s.detail,
        )
        for s in check.steps
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join(
        f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}" for r in rows
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpucheck",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--out",
        default=os.environ.get("OUT") or f"gpucheck-{time.strftime('%Y%m%dT%H%M%S')}",
        help="where the captures and result.json go (default $OUT)",
    )
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="the nvidia-smi command")
    parser.add_argument(
        "--libcuda", default="libcuda.so.1", help="the CUDA driver library the ctypes worker loads"
    )
    parser.add_argument(
        "--cuda",
        choices=BACKENDS,
        default="auto",
        help="how the CUDA processes hold memory (default: PyTorch, CuPy, else libcuda)",
    )
    parser.add_argument("--mib", type=int, default=256, help="MiB each CUDA process holds")
    parser.add_argument("--seconds", type=int, default=10, help="seconds of dmon and pmon")
    parser.add_argument(
        "--deadline",
        type=float,
        default=5.0,
        help="seconds /status may take to show a process (default 5)",
    )
    parser.add_argument(
        "--python",
        default="",
        help="the Python the throwaway users run (default: the first of this "
        "one and /usr/bin/python3 they may run)",
    )
    options = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench.gpucheck: run it as root (it makes throwaway users)", file=sys.stderr)
        return 2
    os.makedirs(options.out, exist_ok=True)
    check = Check(options, options.out, log)
    began = time.time()
    passed = check.run()
    result = {
        **check.result(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(began)),
        "seconds": round(time.time() - began, 1),
        "nvidia_smi": options.nvidia_smi,
    }
    with open(os.path.join(options.out, "result.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(table(check))
    print(
        f"{'passed' if passed else 'FAILED'} in {result['seconds']} s; "
        f"{os.path.abspath(options.out)}/result.json"
    )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
