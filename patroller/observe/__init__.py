"""Watching the GPUs: nvidia-smi's children and what they print, turned into the daemon's
signals and statistics.

Owns: the signals, the child-process supervisor, the parsers of nvidia-smi's output (`nvsmi`),
the dmon and pmon monitors, the inventory read again, the compute-apps cross-check, the latest
statistics, idle detection, and test mode's synthetic devices.
May import: `patroller.core`, `patroller.config`; Tornado and blinker.
"""
