"""``diagnose schema [report|check|replay|verify|fleet|failed]``: print the JSON Schema (draft 2020-12) of a
``--format json`` output.

The files are ``schemas/<name>-1.schema.json`` in a checkout; a wheel carries them as ``diagnose/_schemas`` (a
symlink to ``../schemas``, like ``diagnose/_rules``). They are printed byte for byte, so a user can save the output
and feed it to any validator. ``tests/test_json_schema.py`` validates every sample log's report against them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diagnose.model import DiagnoseError

# command-line name -> (file, the "schema" value of the documents it describes)
SCHEMAS = {name: (f"{name}-1.schema.json", f"diagnose/{name}@1")
           for name in ("report", "check", "replay", "verify", "fleet", "failed")}
EXIT_OK = 0


def schemas_dir() -> Path:
    """The folder holding the schema files: ``diagnose/_schemas`` when installed, ``schemas/`` in a checkout."""
    here = Path(__file__).resolve().parent.parent.parent  # diagnose/
    for candidate in (here / "_schemas", here.parent / "schemas"):
        if candidate.is_dir() and any(candidate.glob("*.schema.json")):
            return candidate
    raise DiagnoseError("the JSON schema files are missing from this installation (reinstall diagnose)")


def schema_path(name: str) -> Path:
    if name not in SCHEMAS:
        raise DiagnoseError(f"unknown schema {name!r}: choose one of {', '.join(SCHEMAS)}")
    path = schemas_dir() / SCHEMAS[name][0]
    if not path.is_file():
        raise DiagnoseError(f"the JSON schema file {path.name} is missing from this installation (reinstall diagnose)")
    return path


def schema_text(name: str) -> str:
    return schema_path(name).read_text(encoding="utf-8")


def run(args: Any) -> int:
    text = schema_text(getattr(args, "name", None) or "report")
    from diagnose.present.output import write_output

    write_output(getattr(args, "output", None), text)
    return EXIT_OK


__all__ = ["SCHEMAS", "run", "schema_path", "schema_text", "schemas_dir"]
