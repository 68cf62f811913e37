"""``diagnose mcp`` with the official MCP SDK's own client over stdio: the tools are listed, called and answered,
and bad input is an error result, not a crash (the same session keeps answering)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import jsonschema
import pytest

mcp = pytest.importorskip("mcp", reason="the MCP SDK (pip install mcp)")

from diagnose.present.commands.schema import schema_text  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LOG = ROOT / "sample_logs" / "captured" / "b062_mfsdp_ckpt_format_new.log"
CLEAN = ROOT / "sample_logs" / "captured" / "b062_tiny_train_success.log"
TOOLS = {"analyze", "verify", "check", "replay", "slurm"}


def _field(obj, snake: str, camel: str):
    return getattr(obj, snake, None) if hasattr(obj, snake) else getattr(obj, camel, None)


def _payload(result) -> dict:
    structured = _field(result, "structured_content", "structuredContent")
    if structured:
        return structured.get("result", structured) if set(structured) == {"result"} else structured
    return json.loads(result.content[0].text)


async def _session_run(calls):
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    env = dict(os.environ, PYTHONPATH=str(ROOT), DIAGNOSE_SKIP_SLURM="1")
    params = StdioServerParameters(command=sys.executable, args=["-m", "diagnose", "mcp"], env=env, cwd=str(ROOT))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        listed = await session.list_tools()
        results = []
        for name, arguments in calls:
            results.append(await session.call_tool(name, arguments))
        return listed, results


def _run(calls):
    import anyio

    return anyio.run(_session_run, calls)


def test_tools_listed_called_and_bad_input_is_an_error_result(tmp_path):
    cfg = tmp_path / "run_config.yaml"
    cfg.write_text("dist:\n  use_megatron_fsdp: true\n")
    listed, results = _run([
        ("analyze", {"paths": [str(LOG)]}),
        ("analyze", {"paths": [str(tmp_path / "missing.log")]}),
        ("analyze", {"paths": ["-"]}),
        ("analyze", {"paths": ["--help"]}),
        ("verify", {"paths": [str(CLEAN)]}),
        ("replay", {"config": str(cfg), "bridge_version": "0.7.0"}),
        ("check", {"config": str(cfg), "gpus": 0}),
        ("analyze", {"paths": [str(CLEAN)]}),  # the server still answers after the errors
    ])
    tools = {t.name: t for t in listed.tools}
    assert TOOLS <= set(tools)
    for tool in tools.values():
        assert tool.description
        annotations = tool.annotations
        assert annotations is not None and _field(annotations, "read_only_hint", "readOnlyHint") is True

    analyze, missing, stdin, option, verify, replay, bad_gpus, again = results
    assert not _field(analyze, "is_error", "isError")
    report = _payload(analyze)
    jsonschema.validate(report, json.loads(schema_text("report")))
    assert report["findings"][report["root_cause"]]["rule"] == "MB111"  # the captured Megatron-FSDP format error

    for bad, words in ((missing, "no such file"), (stdin, "stdin"), (option, "no such file")):
        assert _field(bad, "is_error", "isError") is True
        text = bad.content[0].text
        assert words in text and "\n" not in text.strip() and "Traceback" not in text

    v = _payload(verify)
    jsonschema.validate(v, json.loads(schema_text("verify")))
    assert v["verify"]["run"]["wrapper"] == "ddp" and v["verify"]["passes"] is False

    r = _payload(replay)
    jsonschema.validate(r, json.loads(schema_text("replay")))
    assert r["replay"]["after_fix"]["passes"] is True
    assert {"key": "ddp.use_megatron_fsdp", "value": True} in r["replay"]["fix"]

    assert _field(bad_gpus, "is_error", "isError") is True
    assert _payload(again)["root_cause"] is None


def test_server_without_the_sdk_is_a_one_line_error(tmp_path):
    import subprocess

    blocker = tmp_path / "block" / "mcp"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('blocked for the test')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "block"), str(ROOT)]))
    proc = subprocess.run([sys.executable, "-m", "diagnose", "mcp"], env=env, cwd=str(ROOT), capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "pip install mcp" in proc.stderr
    assert "Traceback" not in proc.stderr
