"""The usage store: GPU usage history on disk, one row per GPU per interval, in SQLite.

Owns: the store's file and its schema with the migrations (schema.py), its one writer thread,
the set-aside of a file it cannot use, the folding of old rows into daily totals, and its
reader (store.py), the reports' queries (queries.py; by two keys, or in a time zone,
groupings.py), and the sampler that takes a sample of every GPU on the event loop and hands
it to the writer (sampler.py).
May import: `patroller.observe`, `patroller.config`, `patroller.core`; Tornado.
"""
