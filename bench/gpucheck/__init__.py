"""The real-GPU check: `python -m bench.gpucheck` (or scripts/gpu-check.sh), as root, on a host
with at least one NVIDIA GPU, in under five minutes, with no network. See __main__.py."""
