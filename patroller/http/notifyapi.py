"""A user's own notification destinations: `GET /notify` lists them, `POST /notify/add` (the
URL in the form body, never the query: it holds a password or a token), `/notify/remove?n=N`,
`/notify/mute?kind=K`, `/notify/unmute?kind=K` and `/notify/test` change or try them. The
caller is identified as every caller is (the kernel, the container engines), and only ever
reaches her own: no argument names another user. A caller who cannot be identified gets 403."""

from __future__ import annotations

from typing import Any

from patroller.config.settings import NOTIFY_KINDS
from patroller.core.errors import BadRequest, Unavailable
from patroller.http import query
from patroller.http.handlers import Handler, View
from patroller.notify.destinations import DestinationError
from patroller.notify.notifier import Notifier
from patroller.notify.people import TEST, People
from patroller.notify.terminal import TERMINAL

Args = dict[str, list[bytes]]
TAKES = {"add": ("url",), "remove": ("n",), "mute": ("kind",), "unmute": ("kind",), "test": ()}


class NotifyHandler(View):
    """GET /notify: the caller's destinations (secrets starred), the kinds she muted, and
    whether the host's default reaches her when she has none."""

    async def get(self) -> None:
        args = self.args()
        _only(args, (), "/notify")
        caller = await self.caller(query.parse_user(args))
        self.send(await _notifier(self).listing(caller.user))


class NotifyChangeHandler(Handler):
    """POST /notify/<action>: a change to the caller's own destinations (a subclass each)."""

    ACTION = ""

    async def post(self) -> None:
        action = self.ACTION
        args = self.args()
        if "url" in self.request.query_arguments:
            raise BadRequest(
                "url: send it in the request's body (a form: url=...), never in "
                "the query, where it could be logged"
            )
        _only(args, TAKES[action], f"/notify/{action}")
        caller = await self.caller(query.parse_user(args))
        notifier = _notifier(self)
        if self.unanswerable():
            return
        try:
            answer: dict[str, Any]
            if action == "add":
                number = await notifier.add(caller.user, _one(args, "url"))
                answer = {"added": number}
            elif action == "remove":
                notifier.remove(caller.user, _number(_one(args, "n")))
                answer = {"removed": True}
            elif action in ("mute", "unmute"):
                kind = _one(args, "kind").strip().lower()
                kinds = (*NOTIFY_KINDS, TEST, TERMINAL)
                if kind not in kinds:
                    raise BadRequest(f"kind: {kind[:40]!r} is none of {', '.join(kinds)}")
                answer = {"muted": list(notifier.mute(caller.user, kind, action == "mute"))}
            else:
                answer = {"sent_to": notifier.test(caller.user)}
        except DestinationError as exc:
            raise BadRequest(str(exc)) from None
        listing = await notifier.listing(caller.user)
        self.send({**answer, **listing})


def _notifier(handler: Handler) -> People:
    notifier: Notifier | None = handler.services.notifier
    if notifier is None:
        raise Unavailable("notifications are not part of this daemon")
    return notifier.people


def _only(args: Args, names: tuple[str, ...], endpoint: str) -> None:
    for name in args:
        if name not in (*names, "user"):
            takes = " and ".join(f"{n}=" for n in names) or "nothing"
            raise BadRequest(
                f"{endpoint} takes {takes} (and user= in test mode), not {name[:64]}="
            )


def _one(args: Args, name: str) -> str:
    values = args.get(name) or []
    if len(values) != 1:
        raise BadRequest(f"{name}: give it once")
    try:
        return values[0].decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(f"{name}: not UTF-8") from None


def _number(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 1000:
        raise BadRequest(f"n: {text[:20]!r} is not a destination's number (1, 2, ...)")
    return int(text)


CHANGES = {
    action: type(
        f"Notify{action.title()}Handler",
        (NotifyChangeHandler,),
        {"ACTION": action, "__doc__": f"POST /notify/{action}"},
    )
    for action in TAKES
}  # the routes: /notify/add, /notify/remove, ...
