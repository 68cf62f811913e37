"""Load a flight-recorder pickle without running code.

A pickle is a program: GLOBAL / STACK_GLOBAL / INST / EXT opcodes import any callable and REDUCE / NEWOBJ / BUILD
call it, so ``pickle.load`` on a file from a job folder can run anything. PyTorch writes these dumps as plain
containers and scalars only (dict, list, tuple, str, int, float, bool, None), so every opcode that needs a class is
refused: ``find_class`` (which GLOBAL, STACK_GLOBAL, INST and the EXT registry all go through) and
``persistent_load`` raise before anything is imported or called. Size is bounded by the caller.

Memory is bounded too: CPython's C unpickler keeps its memo in an array sized by the largest index a LONG_BINPUT
names (twice it), so the 10 bytes ``\x80\x02K\x01r\xff\xff\xff\x3f.`` ask for 16 GiB, touched at once. A real
pickler numbers its memo from 0, one index per object written, so an index beyond the data's length is hostile or
corrupt: such data goes to the pure-Python unpickler, whose memo is a dict (slower, never larger than the data).
"""

from __future__ import annotations

import io
import pickle
import pickletools

_LONG_BINPUT = ord("r")
_STOP = ord(".")


def _argument_table() -> list[tuple[int, int] | None]:
    """Per opcode byte: (n, signed) of its argument as pickletools describes it (n >= 0 a fixed size; the
    negative codes are pickletools' "up to newline" and "length taken from a 1/4/8-byte prefix"), None if unknown."""
    table: list[tuple[int, int] | None] = [None] * 256
    for op in pickletools.opcodes:
        n = op.arg.n if op.arg is not None else 0
        table[ord(op.code)] = (n, op.arg is pickletools.int4 or op.arg is pickletools.string4)
    return table


_ARGUMENTS = _argument_table()


class RefusedPickle(Exception):
    """The pickle asked for a global or a persistent object: it is not a plain flight-recorder dump."""


class PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # noqa: ARG002 - every global is refused
        raise RefusedPickle(f"refused to import {module[:80]}.{name[:80]} (a dump holds only plain data)")

    def persistent_load(self, pid):  # noqa: ARG002
        raise RefusedPickle("refused a persistent object reference (a dump holds only plain data)")


class _PlainPyUnpickler(pickle._Unpickler):
    """The pure-Python unpickler (memo in a dict), refusing globals like PlainUnpickler."""

    find_class = PlainUnpickler.find_class
    persistent_load = PlainUnpickler.persistent_load


def memo_indices_bounded(data: bytes) -> bool:
    """True when no LONG_BINPUT up to the first STOP names an index beyond the data's length. A lean walk over the
    opcodes (string payloads skipped, not decoded): a few times faster than ``pickletools.genops``. An opcode it does
    not know ends the walk: the unpickler stops there too."""
    limit = max(len(data), 1 << 16)
    i, end = 0, len(data)
    while i < end:
        op = data[i]
        spec = _ARGUMENTS[op]
        i += 1
        if spec is None or op == _STOP:
            return True
        n, signed = spec
        if n >= 0:
            if op == _LONG_BINPUT and int.from_bytes(data[i : i + 4], "little") > limit:
                return False
            i += n
        elif n == pickletools.UP_TO_NEWLINE:
            i = data.find(b"\n", i) + 1
            if i == 0:
                return True
        else:
            width = {pickletools.TAKEN_FROM_ARGUMENT1: 1, pickletools.TAKEN_FROM_ARGUMENT4: 4,
                     pickletools.TAKEN_FROM_ARGUMENT4U: 4, pickletools.TAKEN_FROM_ARGUMENT8U: 8}[n]
            length = int.from_bytes(data[i : i + width], "little", signed=bool(signed))
            if length < 0:
                return True
            i += width + length
    return True


def load_plain(data: bytes):
    """Containers and scalars from ``data``; raises RefusedPickle, or pickle/EOF/value errors for a broken one."""
    unpickler = PlainUnpickler if memo_indices_bounded(data) else _PlainPyUnpickler
    return unpickler(io.BytesIO(data)).load()
