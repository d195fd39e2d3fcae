"""How a training script uses Patroller: reserve GPUs first, then start CUDA.

Try it against a test-mode server:
    patroller --test --port 8080 &
    python example.py --server localhost:8080
"""

import argparse
import os

from patroller.client import Busy, Claim, claim, release


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default=os.environ.get("PATROLLER_SERVER", "localhost"))
    parser.add_argument("--gpus", type=int, default=1)
    args = parser.parse_args()

    # 1. Ask once: True and CUDA_VISIBLE_DEVICES set, or False when the GPUs are busy.
    if claim(args.gpus, server=args.server):
        print("claimed GPUs", os.environ["CUDA_VISIBLE_DEVICES"])
        # import torch here: it sees only the claimed GPUs, numbered from 0
        print("released", release(server=args.server))  # else held until this process ends

    # 2. Wait up to ten minutes, and release when the block ends.
    try:
        with Claim(args.gpus, server=args.server, timeout=600) as devices:
            print("training on", [d["info"]["number"] for d in devices])
    except Busy:
        print("no GPU became free in time")


if __name__ == "__main__":
    main()
