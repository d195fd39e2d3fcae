"""Patroller: know which user is on which GPU, and hand out free GPUs fairly."""

__version__ = "0.1.0"
