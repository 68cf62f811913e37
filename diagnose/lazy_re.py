"""Regexes compiled on first use, for modules imported at every start whose patterns few runs read.

A module-level ``regex.compile`` runs at each start of the tool, whether or not the run reaches the code that reads
the pattern: the ``regex`` module compiles slowly (~1-2 ms for a long alternation), and ``match/inference.py``'s
patterns alone cost ~20 ms of a one-line log's start-up, for findings a clean log never has. ``LazyPattern`` holds the
source and compiles it (once) when a method is first called. Each call costs one more Python call than a compiled
pattern's: keep it off per-line hot paths.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import regex


class LazyPattern:
    """A ``regex`` (or ``re``) pattern compiled on first use; the methods a compiled pattern has, with its results."""

    __slots__ = ("pattern", "flags", "_compile", "_compiled")

    def __init__(self, pattern: str, flags: int = 0, compile: Callable[..., Any] = regex.compile) -> None:
        self.pattern = pattern
        self.flags = flags
        self._compile = compile
        self._compiled: Any = None

    @property
    def compiled(self) -> Any:
        rx = self._compiled
        if rx is None:
            rx = self._compiled = self._compile(self.pattern, self.flags)
        return rx

    def search(self, *args: Any, **kwargs: Any) -> Any:
        return self.compiled.search(*args, **kwargs)

    def match(self, *args: Any, **kwargs: Any) -> Any:
        return self.compiled.match(*args, **kwargs)

    def fullmatch(self, *args: Any, **kwargs: Any) -> Any:
        return self.compiled.fullmatch(*args, **kwargs)

    def findall(self, *args: Any, **kwargs: Any) -> Any:
        return self.compiled.findall(*args, **kwargs)

    def finditer(self, *args: Any, **kwargs: Any) -> Any:
        return self.compiled.finditer(*args, **kwargs)

    def sub(self, *args: Any, **kwargs: Any) -> Any:
        return self.compiled.sub(*args, **kwargs)

    def split(self, *args: Any, **kwargs: Any) -> Any:
        return self.compiled.split(*args, **kwargs)

    def __repr__(self) -> str:
        return f"LazyPattern({self.pattern!r})"
