"""The rules, with no I/O: what a device and an identity are, the domain errors, the fair-use
policy, the lease rules (`core.leases`), and small pure helpers (a log throttle, others' text
made printable for a log line).

Owns: Device and Inventory, Identity and ProcessRef, Viewer (whom a caller may see named,
with --hide-users), the errors the API maps to statuses,
Policy, the lease manager with its holds and queue, the Slurm jobs a device is allocated to
(`jobs`), and the GPU-time categories of the usage history with the reports summed from them
(`usage`), and a GPU's health with the Xid catalogue (`health`).
May import: the standard library and `patroller.durations`; nothing else of Patroller, no
third-party package. Everything else builds on this.
"""
