"""fixer38: what qa-report-10 left (L1, L3, L4, L5, L7, L8, L9) and the Slurm states listed three times.

Each test failed on the tree before its fix. Logs are synthetic, in the formats of the messages they quote
(hosts, pids, paths invented)."""

from __future__ import annotations

from conftest import root_finding

# ------------------------------------------------------------------------------ L5: mcp answers a line that is not JSON


def test_mcp_answers_a_line_that_is_not_json_with_a_parse_error_and_keeps_serving():
    """``garbage{`` got no answer (the SDK's transport passes the server an exception, which it logs). JSON-RPC
    answers -32700 with id null; JSON that is no message is -32600; the next valid request is still answered."""
    import json
    import os
    import queue
    import subprocess
    import sys
    import threading

    import pytest

    pytest.importorskip("mcp", reason="the MCP SDK (pip install mcp)")
    from cli_run import ROOT

    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "0"}}}
    lines = ["garbage{", json.dumps(init), "[1,2", '{"a": 1}',
             json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
             json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})]
    env = dict(os.environ, PYTHONPATH=str(ROOT), DIAGNOSE_SKIP_SLURM="1")
    proc = subprocess.Popen([sys.executable, "-m", "diagnose", "mcp"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=str(ROOT), text=True)
    assert proc.stdin is not None and proc.stdout is not None
    got: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [got.put(out) for out in proc.stdout], daemon=True).start()
    answers = []
    try:
        for line in lines:
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
        while len(answers) < 5:
            try:
                answers.append(json.loads(got.get(timeout=30)))
            except queue.Empty:
                break
    finally:
        proc.kill()
        proc.wait(timeout=10)
    errors = [a["error"]["code"] for a in answers if "error" in a]
    assert errors == [-32700, -32700, -32600]
    assert all(a["id"] is None for a in answers if "error" in a)
    assert {a.get("id") for a in answers if "result" in a} == {1, 2}
