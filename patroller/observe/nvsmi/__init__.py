"""What nvidia-smi prints, parsed: `-q -x` (the inventory, discovery.py), the dmon and pmon
streams and `--query-compute-apps` (parsers.py), pmon's sampling intervals (intervals.py), and
`-L`, the
one listing of MIG devices' uuids (listing.py).
Pure functions over text: no process, no clock, no logging.

Owns: the parsers and the records they give.
May import: `patroller.core`.
"""
