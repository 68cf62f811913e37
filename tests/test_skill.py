"""skills/diagnose/SKILL.md follows the open Agent Skills format (agentskills.io specification: YAML front matter
with ``name`` and ``description``; optional ``license``, ``compatibility``, ``metadata``, ``allowed-tools``) and
what it tells an agent to run is real: every ``diagnose ...`` command in it parses with the CLI's own parser and
every MCP tool it names is served."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from diagnose.present.cli import build_parser

SKILL_DIR = Path(__file__).resolve().parent.parent / "skills" / "diagnose"
SKILL = SKILL_DIR / "SKILL.md"
NAME_RE = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
OPTIONAL = {"license", "compatibility", "metadata", "allowed-tools"}


def _front_matter() -> tuple[dict, str]:
    text = SKILL.read_text(encoding="utf-8")
    assert text.startswith("---\n"), "SKILL.md must start with YAML front matter"
    head, sep, body = text[4:].partition("\n---\n")
    assert sep, "front matter must be closed by a '---' line"
    meta = yaml.safe_load(head)
    assert isinstance(meta, dict)
    return meta, body


def test_required_fields():
    meta, _ = _front_matter()
    name = meta.get("name")
    assert isinstance(name, str) and 1 <= len(name) <= 64 and NAME_RE.fullmatch(name)
    assert name == SKILL_DIR.name, "name must match the skill's folder"
    description = meta.get("description")
    assert isinstance(description, str) and description.strip() and len(description) <= 1024
    assert "Use when" in description  # says when to use it, not only what it does


def test_optional_fields_follow_the_format():
    meta, _ = _front_matter()
    assert set(meta) <= {"name", "description"} | OPTIONAL, set(meta) - {"name", "description"} - OPTIONAL
    if "compatibility" in meta:
        assert isinstance(meta["compatibility"], str) and 1 <= len(meta["compatibility"]) <= 500
    if "metadata" in meta:
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in meta["metadata"].items())
    if "allowed-tools" in meta:
        assert isinstance(meta["allowed-tools"], str)


def test_body_has_the_sections_an_agent_needs():
    _, body = _front_matter()
    headings = {h.strip().lower() for h in re.findall(r"^## (.+)$", body, re.M)}
    assert {"when to use", "commands", "reading the json", "examples"} <= headings
    assert len(body.splitlines()) < 500  # the format's advice: keep the instructions short


def _commands(body: str) -> list[str]:
    return [c for c in re.findall(r"`(diagnose [^`]+)`", body) if "|" not in c and "NAME" not in c
            and "RULE" not in c]


def test_every_command_in_the_skill_parses():
    _, body = _front_matter()
    commands = _commands(body)
    assert len(commands) >= 6
    parser = build_parser()
    for command in commands:
        argv = shlex.split(command)[1:]
        try:
            parser.parse_args(argv)
        except SystemExit as e:  # pragma: no cover - the message names the stale command
            pytest.fail(f"SKILL.md command does not parse: {command} ({e})")


def test_every_mcp_tool_it_names_is_served():
    from diagnose.present.mcp_server import TOOLS

    _, body = _front_matter()
    named = set(re.findall(r"^\| [^|]+ \| `(\w+)`", body, re.M))
    assert named and named <= set(TOOLS)
