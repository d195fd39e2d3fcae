"""Never twice, never in the way: each episode is told once, and again only after
`notify_repeat` while it lasts; each destination gets at most `notify_rate` notices per
window, and those held back are summed up in the next one it gets. Pure: the clock is given."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import replace

from patroller.core.throttle import Throttle
from patroller.durations import describe
from patroller.notify.messages import Notice


class Episodes:
    """Which episodes were told, and when. At most `most` are remembered, the least recently
    looked at forgotten first (told again if they come back): an ordered dictionary, its
    least recent first, whose every operation is one call in C (a storm's event is one
    look-up and one entry)."""

    def __init__(self, repeat: float, most: int, clock: Callable[[], float]) -> None:
        self.repeat = repeat
        self.clock = clock
        self.most = most
        self._told: OrderedDict[tuple[str, ...], float] = OrderedDict()

    def _last(self, key: tuple[str, ...]) -> float | None:
        """When `key` was told; a look-up makes it the most recent."""
        last = self._told.get(key)
        if last is not None:
            self._told.move_to_end(key)
        return last

    def _keep(self, key: tuple[str, ...], at: float) -> None:
        told = self._told
        told[key] = at
        told.move_to_end(key)
        if len(told) > self.most:
            told.popitem(last=False)

    def admit(self, key: tuple[str, ...], repeat: float | None = None) -> bool:
        """Whether the episode `key` is to be told now (and if so, it counts as told): not
        if it was within `repeat` seconds (default: the repeat of every episode)."""
        return self.look(key, repeat)[0]

    def look(self, key: tuple[str, ...], repeat: float | None = None) -> tuple[bool, float | None]:
        """`admit`, and the seconds since the episode was told before (None if it was not, or
        is forgotten): one look-up for both (a storm's event asks both)."""
        now = self.clock()
        last = self._last(key)
        if last is None:
            self._keep(key, now)
            return True, None
        if now - last < (self.repeat if repeat is None else repeat):
            return False, now - last
        self._keep(key, now)
        return True, now - last

    def restore(self, key: tuple[str, ...], age: float) -> None:
        """An episode told `age` seconds ago (before a restart: outbox.py)."""
        self._keep(key, self.clock() - max(0.0, age))

    def age(self, key: tuple[str, ...]) -> float | None:
        """Seconds since the episode `key` was last told; None if it was not (or is forgotten)."""
        last = self._last(key)
        return None if last is None else self.clock() - last

    def end(self, key: tuple[str, ...]) -> bool:
        """The episode is over (a GPU back): told again if it begins again. Whether it was told."""
        return self._told.pop(key, None) is not None


class Rates:
    """Each destination's rate: `limit` notices per `window` seconds."""

    def __init__(self, limit: int, window: float, clock: Callable[[], float]) -> None:
        self.limit = limit
        self.window = window
        self.clock = clock
        self._throttles: dict[Hashable, Throttle] = {}
        self._held: dict[Hashable, Counter[str]] = {}

    def admit(
        self, destination: Hashable, kind: str, words: Callable[[], Notice]
    ) -> Notice | None:
        """The notice of `kind` to send to `destination` now, its words made by `words` (with
        a line on what was held back before it), or None: held back, counted, and its words
        never made."""
        throttle = self._throttles.get(destination)
        if throttle is None:
            throttle = self._throttles[destination] = Throttle(self.limit, self.window, self.clock)
        passed, _ = throttle.admit()
        held = self._held.get(destination)
        if held is None:  # (setdefault would make a Counter at every notice)
            held = self._held[destination] = Counter()
        if not passed:
            held[kind] += 1
            return None
        notice = words()
        if not held:
            return notice
        said = ", ".join(f"{count} {kind}" for kind, count in sorted(held.items()))
        held.clear()
        return replace(
            notice,
            body=f"{notice.body}\n\nHeld back before this one, to send no "
            f"more than {self.limit} notices in {describe(self.window)}: "
            f"{said}. `patroller status` and the audit record have them all.",
        )
