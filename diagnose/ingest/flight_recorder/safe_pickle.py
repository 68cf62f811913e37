"""Load a flight-recorder pickle without running code.

A pickle is a program: GLOBAL / STACK_GLOBAL / INST / EXT opcodes import any callable and REDUCE / NEWOBJ / BUILD
call it, so ``pickle.load`` on a file from a job folder can run anything. PyTorch writes these dumps as plain
containers and scalars only (dict, list, tuple, str, int, float, bool, None), so every opcode that needs a class is
refused: ``find_class`` (which GLOBAL, STACK_GLOBAL, INST and the EXT registry all go through) and
``persistent_load`` raise before anything is imported or called. Size is bounded by the caller.
"""

from __future__ import annotations

import io
import pickle


class RefusedPickle(Exception):
    """The pickle asked for a global or a persistent object: it is not a plain flight-recorder dump."""


class PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # noqa: ARG002 - every global is refused
        raise RefusedPickle(f"refused to import {module[:80]}.{name[:80]} (a dump holds only plain data)")

    def persistent_load(self, pid):  # noqa: ARG002
        raise RefusedPickle("refused a persistent object reference (a dump holds only plain data)")


def load_plain(data: bytes):
    """Containers and scalars from ``data``; raises RefusedPickle, or pickle/EOF/value errors for a broken one."""
    return PlainUnpickler(io.BytesIO(data)).load()
