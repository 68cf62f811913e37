"""Install hints name what to install, never a PyPI distribution called ``diagnose``: README installs from a clone,
and a package of that name on PyPI is not this project, so ``pip install 'diagnose[fast]'`` would install someone
else's code (qa-report-4 L6)."""

from __future__ import annotations

from pathlib import Path

import regex

ROOT = Path(__file__).resolve().parents[1]
_FOREIGN_INSTALL = regex.compile(r"""pip install\s+['"]?diagnose\b""")


def test_no_hint_installs_a_distribution_named_diagnose():
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "diagnose").rglob("*.py"))
                 for n, line in enumerate(p.read_text().splitlines(), 1) if _FOREIGN_INSTALL.search(line)]
    assert offenders == []


def test_the_scanner_hint_names_the_packages_of_the_fast_extra():
    from diagnose.pipeline import slow_scanner_hint
    from diagnose.toml_data import tomllib

    hint = slow_scanner_hint("python", 2 << 30)
    assert hint is not None
    fast = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["fast"]
    for requirement in fast:
        name = regex.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
        assert f" {name}" in hint, (name, hint)
