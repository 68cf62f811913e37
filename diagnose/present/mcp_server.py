"""``diagnose mcp``: the diagnose commands as tools of a Model Context Protocol server (stdio), for coding agents.

Tools (each returns the JSON document of the matching ``--format json`` command, described by ``diagnose schema
NAME``): ``analyze`` (report), ``verify`` (verify), ``check`` (check), ``replay`` (replay), ``slurm`` (report).

Read-only: every tool runs the same code path as the command line with ``--format json`` and writes only to a
private temporary file that it reads back; nothing the agent passes can name an output file, start the TUI, follow
a job or read stdin (stdin is the protocol). Inputs are bounded like the CLI's and more: paths only (existing files
or folders, never ``-``), at most ``MAX_PATHS`` of them and ``MAX_INPUT_BYTES`` in total, ``--set`` overrides and
strings of bounded length; arguments are placed after ``--`` so a path can never be read as an option. A bad input
is a tool error result (one line), never a crash of the server.

Built on the official ``mcp`` Python SDK (2.x ``MCPServer``; 1.x ``FastMCP`` has the same decorator API).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from diagnose.model import DiagnoseError

MAX_PATHS = 256
MAX_INPUT_BYTES = 8 << 30  # 8 GiB: the scanner streams windows, but an agent should not start an hour-long scan
MAX_SETS = 64
MAX_TEXT = 1000

INSTRUCTIONS = (
    "diagnose explains failed Megatron-Bridge / Megatron-Core training jobs from their logs (root cause, evidence "
    "lines, config overrides proven by replaying Megatron-Bridge's validation, a memory model for CUDA OOMs) and "
    "verifies that a finished run really trained with Megatron FSDP. Pass paths to log files on this machine. "
    "Read report.root_cause (an index into report.findings, null when no failure was found), each finding's "
    "evidence and fix, report.replay (proven: the fix passes validation on the job's own config) and "
    "report.memory; verify.passes and verify.checks[*].verdict for a finished run."
)


def _import_server_class():
    try:
        from mcp.server.mcpserver import MCPServer  # mcp >= 2
    except ImportError:
        try:
            from mcp.server.fastmcp import FastMCP as MCPServer  # type: ignore[attr-defined,no-redef]  # mcp 1.x
        except ImportError as e:
            raise DiagnoseError("'diagnose mcp' needs the MCP Python SDK: pip install mcp "
                                "(the checkout's [agent] extra)") from e
    return MCPServer


# ------------------------------------------------------------------------------------------- inputs


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT or "\x00" in value:
        raise DiagnoseError(f"{name}: expected a non-empty string of at most {MAX_TEXT} characters")
    return value


def checked_paths(paths: Any, what: str = "paths") -> list[str]:
    """Existing files or folders, bounded in number and total size; never stdin."""
    if isinstance(paths, str):
        paths = [paths]
    if not isinstance(paths, list) or not paths:
        raise DiagnoseError(f"{what}: give at least one path to a log file or folder")
    if len(paths) > MAX_PATHS:
        raise DiagnoseError(f"{what}: at most {MAX_PATHS} paths")
    total = 0
    out = []
    for raw in paths:
        p = _text(what, raw)
        if p == "-":
            raise DiagnoseError(f"{what}: '-' (stdin) is not available over MCP: give a path")
        path = Path(p).expanduser()
        if not path.exists():
            raise DiagnoseError(f"{p}: no such file or directory")
        if path.is_dir():
            total += sum(f.stat().st_size for f in _walk(path))
        elif path.is_file():
            total += path.stat().st_size
        else:
            raise DiagnoseError(f"{p}: not a regular file or folder")
        if total > MAX_INPUT_BYTES:
            raise DiagnoseError(f"{what}: more than {MAX_INPUT_BYTES >> 30} GiB of input; run the diagnose CLI instead")
        out.append(str(path))
    return out


def _walk(folder: Path, limit: int = 100_000):
    n = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            n += 1
            if n > limit:
                raise DiagnoseError(f"{folder}: more than {limit} files")
            f = Path(root) / name
            if f.is_file():
                yield f


def _sets(sets: Any) -> list[str]:
    if sets is None:
        return []
    if isinstance(sets, str):
        sets = [sets]
    if not isinstance(sets, list) or len(sets) > MAX_SETS:
        raise DiagnoseError(f"sets: a list of at most {MAX_SETS} KEY=VALUE overrides")
    out: list[str] = []
    for s in sets:
        out += ["--set", _text("sets", s)]
    return out


def _opt(flag: str, value: Any) -> list[str]:
    return [] if value in (None, "") else [flag, _text(flag, str(value))]


# ------------------------------------------------------------------------------------------- running


def run_command(argv: list[str]) -> dict[str, Any]:
    """Run one CLI command with ``--format json`` into a private temporary file and return its JSON document.
    Usage and input errors raise DiagnoseError (one line)."""
    import importlib

    from diagnose.present.cli import build_parser

    with tempfile.TemporaryDirectory(prefix="diagnose-mcp-") as tmp:
        out = os.path.join(tmp, "out.json")
        command, rest = argv[0], argv[1:]
        cut = rest.index("--") if "--" in rest else len(rest)
        full = [command, *rest[:cut], "--format", "json", "--output", out, *rest[cut:]]
        try:
            args = build_parser().parse_args(full)
        except SystemExit as e:  # argparse already wrote its one line to stderr (the server's log)
            raise DiagnoseError(f"invalid arguments for {command}") from e
        module = importlib.import_module(f"diagnose.present.commands.{command}")
        module.run(args)
        try:
            with open(out, encoding="utf-8") as fh:
                return json.load(fh)
        except (OSError, ValueError) as e:
            raise DiagnoseError(f"{command} produced no JSON output") from e


def tool_analyze(paths: list[str], bridge_version: str | None = None, config: str | None = None) -> dict[str, Any]:
    cfg = checked_paths([config], "config")[0] if config else None
    return run_command(["analyze", "--no-progress", *_opt("--bridge-version", bridge_version),
                        *_opt("--config", cfg), "--", *checked_paths(paths)])


def tool_verify(paths: list[str], bridge_version: str | None = None, config: str | None = None,
                strict: bool = False) -> dict[str, Any]:
    cfg = checked_paths([config], "config")[0] if config else None
    return run_command(["verify", *_opt("--bridge-version", bridge_version), *_opt("--config", cfg),
                        *(["--strict"] if strict else []), "--", *checked_paths(paths)])


def tool_check(config: str, gpus: int, gpu: str | None = None, gpu_memory: str | None = None,
               sets: list[str] | None = None, bridge_version: str | None = None) -> dict[str, Any]:
    if not isinstance(gpus, int) or isinstance(gpus, bool) or not 1 <= gpus <= 1_000_000:
        raise DiagnoseError("gpus: a whole number from 1 to 1,000,000")
    return run_command(["check", "--gpus", str(gpus), *_opt("--gpu", gpu), *_opt("--gpu-memory", gpu_memory),
                        *_sets(sets), *_opt("--bridge-version", bridge_version), "--",
                        checked_paths([config], "config")[0]])


def tool_replay(config: str, sets: list[str] | None = None, bridge_version: str | None = None,
                gpus: int | None = None) -> dict[str, Any]:
    if gpus is not None and (not isinstance(gpus, int) or isinstance(gpus, bool) or not 1 <= gpus <= 1_000_000):
        raise DiagnoseError("gpus: a whole number from 1 to 1,000,000")
    return run_command(["replay", *_sets(sets), *_opt("--bridge-version", bridge_version),
                        *_opt("--gpus", gpus), "--", checked_paths([config], "config")[0]])


def tool_slurm(jobid: str, step: str | None = None) -> dict[str, Any]:
    return run_command(["slurm", *_opt("--step", step), "--", _text("jobid", jobid)])


TOOLS = {
    "analyze": (tool_analyze, "Diagnose a failed Megatron-Bridge / Megatron-Core job from its log file(s) or a "
                "folder of per-rank logs: root cause with evidence lines, the fix as config overrides proven by "
                "replaying the validation, and the memory model for CUDA OOMs. Returns the report JSON "
                "(diagnose schema report); root_cause null means no failure was found (the report then carries "
                "a verify section)."),
    "verify": (tool_verify, "Check that a finished run's log shows a working Megatron FSDP run: FSDP wrapper "
               "really built (not DistributedDataParallel), sharding strategy, DP size, loss finite to the last "
               "iteration, checkpoint saved in fsdp_dtensor, performance fallbacks. Returns the verify JSON "
               "(diagnose schema verify); verify.passes is true only when every check holds."),
    "check": (tool_check, "Before launch: will this config (run_config.yaml, recipe YAML dump, Megatron-LM "
              "argument list) fail Megatron-Bridge validation or run out of GPU memory on N GPUs? Returns the check "
              "JSON (diagnose schema check)."),
    "replay": (tool_replay, "Replay a config (or a log) through Megatron-Bridge's validation for a release, with "
               "optional KEY=VALUE overrides; extends a fix until it passes. Returns the replay JSON (diagnose "
               "schema replay): replay.after_fix.passes, replay.fix, replay.render.cli, replay.assumed_release."),
    "slurm": (tool_slurm, "Diagnose a Slurm job by id (finds its output through scontrol/sacct). Returns the report "
              "JSON with a slurm section."),
}


def build_server():
    """The MCP server with every tool registered (tools are read-only)."""
    server_class = _import_server_class()
    kwargs: dict[str, Any] = {"instructions": INSTRUCTIONS}
    server = server_class("diagnose", **kwargs)
    try:
        from mcp.types import ToolAnnotations

        annotations = ToolAnnotations(readOnlyHint=True, destructiveHint=False, idempotentHint=True,  # type: ignore[call-arg]
                                      openWorldHint=False)
    except Exception:  # noqa: BLE001 - annotations are a hint; an SDK without them still serves the tools
        annotations = None
    for name, (fn, description) in TOOLS.items():
        server.tool(name=name, description=description, annotations=annotations)(_as_tool(fn))
    return server


def _as_tool(fn):
    """Wrap a tool so that a DiagnoseError (bad input) becomes the SDK's tool error: an error result with one line,
    not a crash; anything else is reported the same way, without a traceback to the agent."""
    import functools

    @functools.wraps(fn)
    def tool(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except DiagnoseError as e:
            raise _tool_error(str(e)) from None
        except Exception as e:  # noqa: BLE001 - the server must survive any input
            raise _tool_error(f"internal error: {type(e).__name__}: {e}") from None

    return tool


def _tool_error(message: str) -> Exception:
    try:
        from mcp.server.mcpserver.exceptions import ToolError
    except ImportError:
        try:
            from mcp.server.fastmcp.exceptions import ToolError  # type: ignore[no-redef]
        except ImportError:
            return RuntimeError(message)
    return ToolError(message)


def serve() -> None:
    """Run the server on stdio until the client closes the connection.

    A line that is not a JSON-RPC message gets JSON-RPC's error answer (id null): ``-32700 Parse error`` when it is
    not JSON, ``-32600 Invalid Request`` when it is JSON of another shape; the server keeps serving. The SDK's stdio
    transport hands such a line to the server as an exception, which it only logs, so the client waited for nothing.
    """
    server = build_server()
    lowlevel = getattr(server, "_lowlevel_server", None) or getattr(server, "_mcp_server", None)
    if lowlevel is None or not hasattr(lowlevel, "create_initialization_options"):  # an SDK laid out otherwise
        server.run("stdio")
        return
    import anyio

    anyio.run(_serve_stdio, lowlevel)


def rejection(error: Exception):
    """The JSON-RPC error message (a ``SessionMessage``) answering a line the transport could not read as a message:
    ``-32700 Parse error`` for text that is not JSON, ``-32600 Invalid Request`` for JSON that is no message."""
    from mcp.shared.message import SessionMessage
    from mcp.types import INVALID_REQUEST, PARSE_ERROR, ErrorData, JSONRPCError

    errors = getattr(error, "errors", None)
    kinds = {e.get("type") for e in errors()} if callable(errors) else set()
    if "json_invalid" in kinds or not kinds:
        data = ErrorData(code=PARSE_ERROR, message="Parse error")
    else:
        data = ErrorData(code=INVALID_REQUEST, message="Invalid Request")
    return SessionMessage(JSONRPCError(jsonrpc="2.0", id=None, error=data))


async def _serve_stdio(lowlevel: Any) -> None:
    """The SDK's ``run_stdio_async``, with the lines it could not read answered (``rejection``) instead of passed
    to the server."""
    import anyio
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read_stream, write_stream):
        send, receive = anyio.create_memory_object_stream[Any](0)

        async def relay() -> None:
            async with send:
                async for item in read_stream:
                    if isinstance(item, Exception):
                        await write_stream.send(rejection(item))
                    else:
                        await send.send(item)

        async with anyio.create_task_group() as tg:
            tg.start_soon(relay)
            await lowlevel.run(receive, write_stream, lowlevel.create_initialization_options())
