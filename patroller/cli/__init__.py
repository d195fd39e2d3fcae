"""The command line: `patroller run|status|release|wait|reserve|report|...`.

Owns: parsing the commands, finding the daemon (`finding`: its socket, PATROLLER_SERVER, the
configuration file's port), talking to the server through `patroller.client`, rendering what it
answers, exit statuses. May import: the standard library (and `tomli` on Python 3.10, when it
is there), `patroller.client`, `patroller.durations`, `patroller.hosts` and
`patroller.answers`; nothing of the daemon (no Tornado, no Docker SDK), so that it runs
wherever the client is installed.
"""

from patroller.cli.commands import main
from patroller.cli.parser import COMMANDS

__all__ = ["COMMANDS", "main"]
