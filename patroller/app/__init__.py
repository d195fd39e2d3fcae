"""The daemon: its services built and connected, the API over them, started and stopped in
order.

Owns: building the daemon from the configuration (assembly: the devices discovered, the
services made and connected, the API over them) and running it (daemon: `Daemon` starts,
listens and stops, in order, and does nothing else; StartError, the one-line reason it cannot).
May import: every layer below it (`patroller.heap`, `patroller.http`, `patroller.doctor`,
`patroller.services`, `patroller.notify`, `patroller.state`, `patroller.identify`,
`patroller.observe`, `patroller.config`, `patroller.core`); Tornado.
"""

from patroller.app.assembly import assemble, build, connect, make_policy, schedulers
from patroller.app.daemon import Daemon, StartError

__all__ = ["Daemon", "StartError", "assemble", "build", "connect", "make_policy", "schedulers"]
