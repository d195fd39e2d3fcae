"""Telling people: what happens on the GPUs (a trespass, a wait granted, a GPU lost) becomes a
short plain notice, told once per episode, and delivered off the event loop through Apprise to
the admin's destinations (e-mail, Slack, ntfy, a JSON webhook, ...); and, with
--notify-digest, each week's digest of the usage store's figures.

Owns: the notices' words (messages.py), which episode is told and when again, and the rate
each destination is sent at (episodes.py), the delivery queues, tries and counts (delivery.py),
the users' own terminals (--notify-terminal: terminal.py, and the login records, utmp.py),
the admin's destinations (admins.py), the watch for what no event says (watch.py), what
became of each notice and its audit line (outcomes.py), the outbox that a restart reads
(outbox.py), the follower of the lease rules' events that joins them (notifier.py), and the
weekly digest: when it is due and its words (digest.py), its timer and its reading
(weekly.py).
May import: `patroller.state`, `patroller.config`, `patroller.core`; cachetools, and Apprise
(the optional `notify` extra: without it nothing is sent but on terminals, and the doctor says
so).
"""

from patroller.notify.notifier import Notifier

__all__ = ["Notifier"]
