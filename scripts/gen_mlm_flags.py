#!/usr/bin/env python3
"""Write diagnose/explain/config/mlm_flags.txt: every Megatron-LM command-line flag, from the sources of a checkout.

    python3 scripts/gen_mlm_flags.py /path/to/Megatron-LM.git [TAG ...]

Reads ``megatron/training/arguments.py`` (``megatron/arguments.py`` in old releases) at each tag with ``git show``
and never imports or runs it: the literal ``'--flag'`` strings of ``add_argument`` calls, and, for the argument
groups newer releases build from dataclasses (``ArgumentGroupFactory(SomeConfig)``), ``--field-name`` for every
field of that class with the ``--no-``/``--disable-`` forms a boolean gets. The list is the union over the tags: a
flag any of those releases accepts is never called a typo (``diagnose.explain.config.keycheck``).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "diagnose" / "explain" / "config" / "mlm_flags.txt"
DEFAULT_TAGS = ("core_v0.8.0", "core_v0.10.0", "core_v0.12.0", "core_v0.14.0", "HEAD")
ARGUMENT_FILES = ("megatron/training/arguments.py", "megatron/arguments.py")


def show(repo: str, tag: str, path: str) -> str | None:
    done = subprocess.run(["git", "--git-dir", repo, "show", f"{tag}:{path}"], capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None


def class_fields(repo: str, tag: str, name: str) -> list[str]:
    """Field names of dataclass ``name`` (and its bases found the same way) anywhere under megatron/."""
    files = subprocess.run(["git", "--git-dir", repo, "grep", "-l", f"class {name}\\b", tag, "--", "megatron"],
                           capture_output=True, text=True).stdout.split()
    out: list[str] = []
    for spec in files:
        source = show(repo, tag, spec.split(":", 1)[1])
        if not source:
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef) and node.name == name:
                out += [n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
                for base in node.bases:
                    if isinstance(base, ast.Name) and base.id != name:
                        out += class_fields(repo, tag, base.id)
    return out


def flags_at(repo: str, tag: str) -> set[str]:
    source = next((s for p in ARGUMENT_FILES if (s := show(repo, tag, p))), None)
    if source is None:
        return set()
    flags = set(re.findall(r"""['"](--[a-z0-9][a-z0-9-]*)['"]""", source))
    for cls in set(re.findall(r"ArgumentGroupFactory\(\s*(\w+)", source)):
        for field in class_fields(repo, tag, cls):
            dashed = field.replace("_", "-")
            flags |= {f"--{dashed}", f"--no-{dashed}", f"--disable-{dashed}"}
    return flags


def main() -> int:
    repo, tags = sys.argv[1], sys.argv[2:] or list(DEFAULT_TAGS)
    flags: set[str] = set()
    for tag in tags:
        got = flags_at(repo, tag)
        print(f"{tag}: {len(got)} flags", file=sys.stderr)
        flags |= got
    OUT.write_text("# Megatron-LM flags at " + ", ".join(tags) + " (scripts/gen_mlm_flags.py)\n"
                   + "\n".join(sorted(flags)) + "\n", encoding="utf-8")
    print(f"{len(flags)} flags -> {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
