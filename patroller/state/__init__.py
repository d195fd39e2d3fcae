"""What outlives a moment: the lease book on disk, the audit record, lease expiry on time, the
lives of the processes devices are held for, and the usage history.

Owns: the lease book with its files (each write whole), its whole on-disk schema and its
locked directory, the audit record, the expiry timer, the lifelines (pidfds) of processes that
hold devices, the pseudonyms of --hide-users and their key, and the usage store (state/usage:
its SQLite file, schema, writer thread, reader and sampler).
May import: `patroller.identify`, `patroller.observe`, `patroller.config`, `patroller.core`,
`patroller.durations`; Tornado, cachetools.
"""
