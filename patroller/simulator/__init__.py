"""A fake nvidia-smi for tests and demonstrations: `python -m patroller.simulator`.

Owns: printing what real drivers print (every era of `-q -x`, dmon, pmon and
`--query-compute-apps`) from a JSON scenario, with faults on demand.
May import: the standard library only; nothing of the daemon it imitates a GPU for.
"""
