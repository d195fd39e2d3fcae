"""GET /whoami: who the daemon takes the caller for, as /request would take them (the identity
it holds devices for). `patroller status --mine` asks it, and keeps the GPUs of that `user`:
the client cannot know how the daemon names it (an e-mail from a container's labels, a Slurm
job's account, a pod's namespace), so it asks rather than guesses."""

from __future__ import annotations

from patroller.http import query
from patroller.http.handlers import View


class WhoAmIHandler(View):
    """The caller's identity (Identity.to_json); 403 when the daemon cannot identify them, as
    /request would refuse them. A caller sees every field of their own identity, whatever
    --hide-users hides from others."""

    async def get(self) -> None:
        identity = await self.caller(query.parse_user(self.args()))
        self.send(identity.to_json())
