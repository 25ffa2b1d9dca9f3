"""One registry style for every plugin family: operators, seeds, timing sources, executors, strategies.

It lives in ``seeds``, the package every other one may import (the bottom layer), so that no
import runs back up.

A family is a lazy map ``name -> "module:attribute"``: nothing is imported until a member is asked
for, so an optional member (Ray) costs nothing until then. Members come from three places, in
this order:

1. the family's built-ins (one line each, in the family's own module);
2. installed packages, through the entry-point group ``pallas_evolve.<family>`` (a user's package
   adds a member with one line in its ``pyproject.toml``, and nothing here is edited);
3. ``register(name, target)`` at run time (a test, a notebook).

``load(name)`` returns the attribute (a class, or for seeds a module); an unknown name is a
``KeyError`` whose message lists the known ones, in one line.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
from typing import Any

GROUP_PREFIX = "pallas_evolve."


class Registry:
    def __init__(self, family: str, builtins: dict[str, str], member: str = "") -> None:
        self.family = family
        self.member = member or family.removesuffix("s")
        self.group = GROUP_PREFIX + family
        self._builtins = dict(builtins)
        self._registered: dict[str, Any] = {}
        self._loaded: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _entry_points(self) -> dict[str, str]:
        try:
            return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=self.group)}
        except Exception:  # noqa: BLE001 - a broken installed distribution must not break the family
            return {}

    def _targets(self) -> dict[str, Any]:
        return {**self._builtins, **self._entry_points(), **self._registered}

    def names(self) -> list[str]:
        """Every member's name: the built-ins first, in their order, then the others."""
        return list(self._targets())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._targets()

    def load(self, name: str) -> Any:
        """The member called ``name`` (imported on first use)."""
        targets = self._targets()
        if name not in targets:
            raise KeyError(f"unknown {self.member} {name!r}; known: {', '.join(targets)}")
        target = targets[name]
        with self._lock:
            if name not in self._loaded:
                self._loaded[name] = _resolve(target) if isinstance(target, str) else target
            return self._loaded[name]

    def register(self, name: str, target: Any) -> None:
        """Add a member at run time: ``target`` is ``"module:attribute"`` or the object itself."""
        if name in self._targets():
            raise ValueError(f"a member named {name!r} is already registered in {self.family}")
        self._registered[name] = target

    def unregister(self, name: str) -> None:
        """Remove a member added with :meth:`register` (tests)."""
        self._registered.pop(name, None)
        self._loaded.pop(name, None)


def _resolve(target: str) -> Any:
    module, _, attribute = target.partition(":")
    value = importlib.import_module(module)
    for part in filter(None, attribute.split(".")):
        value = getattr(value, part)
    return value
