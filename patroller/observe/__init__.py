"""Watching the GPUs: nvidia-smi's children and what they print, turned into the daemon's
signals and statistics.

Owns: the signals, the one supervisor of nvidia-smi's children, the interface every monitor
offers the daemon (its metrics typed, one class per kind of monitor), the parsers of nvidia-smi's
output (`nvsmi`), the dmon and pmon monitors, the
inventory (read at start, and again by its watch, with the MIG devices' uuids of `-L`), the
compute-apps cross-check, the latest statistics, idle detection, each GPU's health (`health`:
-q -x's readings and the Xids of the kernel log, which `kernlog` follows and `xid` parses),
test mode's synthetic devices,
the watches of the schedulers' allocations (`allocwatch`: Slurm's job map, the kubelet's
pod-resources), unary gRPC calls on a unix socket (`grpcunix`), and the protobuf wire format
of their messages (`protowire`: a codec, as `nvsmi` parses nvidia-smi's text).
May import: `patroller.core`, `patroller.config`, `patroller.durations`; Tornado, blinker and
(optional) grpcio.
"""
