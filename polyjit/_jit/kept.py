"""A value kept for an object while the object lives: the one home of the
identity-keyed, bounded caches of the call path.

Two caches need the same thing: `inline.py` keeps an argument's copy on
polyjit's synchronous client (an unchanged argument crosses once), and
`resident.py` keeps a sliced output's padded buffer (a chained call takes it
as it lies). Arrays are immutable and often unhashable, so both key by
identity; an identity is only meaningful while its object lives, so each
entry holds a weak reference, is dropped when the object dies, and is read
only where that reference still gives the same object (an `id` can be
reused). Each cache is bounded: past `most` entries, the oldest goes.
"""

from __future__ import annotations

import weakref
from typing import Any


class KeptWhileAlive:
  """`obj -> value` by identity, for at most `most` live objects."""

  def __init__(self, most: int) -> None:
    self.most = most
    self._entries: dict[int, tuple[weakref.ref[Any], Any]] = {}

  def get(self, obj: Any) -> Any | None:
    """The value kept for `obj`, or None."""
    entry = self._entries.get(id(obj))
    return entry[1] if entry is not None and entry[0]() is obj else None

  def put(self, obj: Any, value: Any) -> None:
    """Keeps `value` while `obj` lives (the oldest entry goes past `most`)."""
    key = id(obj)
    entries = self._entries

    def drop(ref: weakref.ref[Any]) -> None:
      kept = entries.get(key)
      if kept is not None and kept[0] is ref:
        entries.pop(key, None)
    entries[key] = (weakref.ref(obj, drop), value)
    if len(entries) > self.most:
      try:
        del entries[next(iter(entries))]
      except (KeyError, StopIteration, RuntimeError):  # (another thread got there)
        pass

  def clear(self) -> None:
    self._entries.clear()
