"""The usage store: GPU usage history on disk, one row per GPU per interval, in SQLite.

Owns: the store's file and its schema with the migrations (schema.py), the file opened
private or set aside when it cannot be used (files.py), its one writer thread (writer.py), the
store's face: its life, its counts and what went wrong, said (store.py), the folding of old
samples and hourly totals (tables.py),
the names it keeps, cut and bounded (keys.py), the room it leaves for the lease book (room.py),
its reader thread and the answers it keeps (reader.py), the reports' queries (queries.py; by
two keys, or in a time zone, groupings.py), and the sampler that takes a sample of every GPU on
the event loop and hands it to the writer (sampler.py).
May import: `patroller.observe`, `patroller.config`, `patroller.core`; Tornado, cachetools.
"""
