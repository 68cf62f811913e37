"""JSON text every strict reader accepts: no lone surrogates.

A file name whose bytes are not UTF-8 reaches Python as a ``str`` holding lone surrogates (``surrogateescape``:
byte ``FF`` is ``U+DCFF``). ``json.dumps`` writes them as ``"\\udcff"``, which strict readers (serde_json, Go,
jq) refuse or replace. Here each such byte is written as the four characters ``\\xNN`` instead (``h_\\xff.log``:
backslash, x, two hex digits), as ``ls -b`` shows it; any other lone surrogate likewise, byte by byte of its
UTF-8 form. Text that is valid Unicode is untouched.
"""

from __future__ import annotations

import json
from typing import Any


def unicode_clean(value: Any) -> Any:
    """``value`` (dicts, lists, tuples, strings, scalars) with every string made valid Unicode (see above)."""
    if isinstance(value, str):
        return value if value.isascii() else _clean_str(value)
    if isinstance(value, dict):
        return {unicode_clean(k): unicode_clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [unicode_clean(v) for v in value]
    return value


def _clean_str(text: str) -> str:
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        raw = text.encode("utf-8", "surrogateescape")  # the file name's own bytes
    except UnicodeEncodeError:
        raw = text.encode("utf-8", "surrogatepass")  # a surrogate that stands for no byte: its UTF-8 form
    return raw.decode("utf-8", "backslashreplace")


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of ``unicode_clean(value)``: what every command's ``--format json`` writes. What a
    ``default`` makes of an object (``str`` of a path) is cleaned too."""
    default = kwargs.get("default")
    if default is not None:
        kwargs["default"] = lambda obj: unicode_clean(default(obj))
    return json.dumps(unicode_clean(value), **kwargs)
