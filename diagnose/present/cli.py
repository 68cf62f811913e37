"""Command line: argument parsing and dispatch only.

Each sub-command's work lives in ``diagnose/present/commands/<name>.py`` as ``run(args) -> int`` and is imported
only when that command runs, so ``diagnose --help`` stays fast (no torch, textual or megatron import).

Exit codes: 0 no failure found (or the config validates and fits), 1 failure diagnosed (or it would fail),
2 usage or input error. Errors are one line on stderr; ``--debug`` shows the Python traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import sys
from typing import NoReturn

from diagnose import __version__

EXIT_OK, EXIT_FAILURE_FOUND, EXIT_USAGE = 0, 1, 2
_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # a full disk or /dev/full: not an internal error


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse prints usage + exits 2; keep it to one line
        from diagnose.ingest.errors import shown

        hint = self._did_you_mean(message)
        self.exit(EXIT_USAGE, f"diagnose: error: {shown(message)}{hint} (see '{self.prog} --help')\n")

    def _did_you_mean(self, message: str) -> str:
        """A close command, choice or option for ``invalid choice: 'analyse'`` / ``unrecognized arguments:
        --formta`` (the Python 3.12- argparse suggests nothing)."""
        import difflib
        import re

        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if m is not None:
            word, choices = m.group(1), re.findall(r"'([^']*)'", m.group(2))
        else:
            m = re.match(r"unrecognized arguments: (-[^\s=]+)", message)
            if m is None:
                return ""
            word = m.group(1)
            choices = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
        words = _COMMAND_ELSEWHERE.get(word.lower(), "").split()
        at = next((i for i, w in enumerate(words) if w in choices), None)
        if at is not None:  # at the top: "rules show CODE"; under ``rules``: "show CODE"
            return f" (did you mean {' '.join(words[at:])}?)"
        close = difflib.get_close_matches(word.lower(), choices, n=1, cutoff=0.6)
        return f" (did you mean {close[0]}?)" if close and close[0] != word else ""


# words a user types for a command that has another name here ("explain OOM102": a rule's doc is ``rules show``)
_COMMAND_ELSEWHERE = {"explain": "rules show CODE", "describe": "rules show CODE", "doc": "rules show CODE",
                      "lint": "rules lint", "diagnose": "analyze", "triage": "tui"}


def _positive(text: str) -> int:
    """A whole number from 1 (``--jobs 0`` and ``--gpus 0`` used to pass)."""
    if text.strip().isdigit() and len(text.strip().lstrip("0")) > 18:  # past int()'s 4300 digits it is no number
        raise argparse.ArgumentTypeError(f"{_short_arg(text)}: too large")
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


MAX_GPUS = 1_000_000  # as the TUI's what-if editor and the MCP tools: more is a typo, not a cluster


def _gpu_count(text: str) -> int:
    """A GPU count from 1 to MAX_GPUS (``--gpus 10**30`` planned 10**30-way data parallelism; 5000 digits, past
    int()'s limit, were called "not a whole number" and echoed whole)."""
    digits = text.strip()
    if digits.isdigit() and len(digits.lstrip("0")) > len(str(MAX_GPUS)):
        raise argparse.ArgumentTypeError(f"{_short_arg(text)}: more than {MAX_GPUS:,} GPUs")
    value = _positive(text)
    if value > MAX_GPUS:
        raise argparse.ArgumentTypeError(f"{value}: more than {MAX_GPUS:,} GPUs")
    return value


def _short_arg(text: str, limit: int = 24) -> str:
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"


def _release(text: str) -> str:
    """A release number like 0.4.0 (``--bridge-version banana`` used to be taken as "unknown, latest")."""
    import re

    if not re.fullmatch(r"v?\d{1,3}(\.\d{1,4}){0,2}(rc\d+|\.dev\d+|\.post\d+)?", text.strip()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a release number like 0.4.0")
    return text.strip().lstrip("v")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--debug", action="store_true", help="show Python tracebacks for internal errors")


def _format(p: argparse.ArgumentParser, choices=("text", "json", "markdown")) -> None:
    p.add_argument("--format", "-f", choices=choices, default="text", help="output format (default: text)")
    p.add_argument("--output", "-o", metavar="FILE", help="write the report to FILE instead of stdout (-: stdout)")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour in text output (NO_COLOR is honoured)")


def _detail(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quiet", "-q", dest="detail", action="store_const", const="quiet", default="default",
                   help="text: only the root cause, its evidence line and the fix")
    g.add_argument("--verbose", "-v", dest="detail", action="store_const", const="verbose",
                   help="text and markdown: also the facts, the YAML fix and the config, replay and memory details")


def _rules_opt(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rules", action="append", default=[], metavar="DIR",
                   help="add a folder (or file) of user rules; repeatable")


def _gpu_opts(p: argparse.ArgumentParser, when: str = "") -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--gpu-memory", metavar="SIZE", help=f"{when}memory per GPU, e.g. 80GiB")
    g.add_argument("--gpu", metavar="NAME", help=f"{when}GPU model, e.g. h100-80gb, h200, a100-40gb, b200")


def _set_opt(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                   help="override a config value, Megatron-Bridge path (e.g. ddp.use_megatron_fsdp=true); repeatable")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="diagnose", description="Diagnose failed Megatron-Bridge / Megatron-Core training jobs: "
                     "root cause, evidence, and config overrides proven to pass validation and fit in memory.")
    parser.add_argument("--version", "-V", action="version", version=f"diagnose {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("analyze", help="diagnose a failed job's log(s)", description="Diagnose a failed job's log.")
    p.add_argument("paths", nargs="+", metavar="LOG",
                   help="log file(s), a folder of per-rank logs, .gz, or - for stdin")
    _format(p, ("text", "json", "markdown", "jsonl", "sarif", "github"))
    _rules_opt(p)
    p.add_argument("--config", metavar="FILE",
                   help="the job's run_config.yaml (or Megatron-LM args), if not in the log")
    p.add_argument("--bridge-version", type=_release, metavar="X.Y.Z",
                   help="Megatron-Bridge release the job ran (default: inferred)")
    p.add_argument("--gpu-memory", metavar="SIZE", help="GPU memory, e.g. 80GiB (default: from the OOM message)")
    p.add_argument("--no-replay", action="store_true", help="skip config replay and the memory model")
    p.add_argument("--jobs", "-j", type=_positive, default=0, metavar="N", help="scan with N processes (default: 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--select", action="append", default=[], metavar="CODES",
                   help="run only these rules: codes or prefixes, comma-separated (e.g. OOM,NC002); repeatable")
    p.add_argument("--ignore", action="append", default=[], metavar="CODES",
                   help="do not run these rules: codes or prefixes, comma-separated (e.g. LA004); repeatable")
    p.add_argument("--include", action="append", default=[], metavar="GLOB",
                   help="in a folder, read only files matching GLOB (path in the folder or name); repeatable")
    p.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                   help="in a folder, skip files matching GLOB (e.g. '*stdout*'); repeatable")
    p.add_argument("--exit-zero", action="store_true",
                   help="exit 0 even when a failure is diagnosed (2 still means bad input)")
    _detail(p)
    _common(p)

    p = sub.add_parser("rules", help="list, show and lint the rules catalogue")
    rsub = p.add_subparsers(dest="rules_command", metavar="ACTION", parser_class=_Parser, required=True)
    q = rsub.add_parser("list", help="list every rule")
    _rules_opt(q)
    q.add_argument("--format", "-f", choices=("text", "json"), default="text")
    _common(q)
    q = rsub.add_parser("show", help="show one rule's documentation")
    q.add_argument("code", help="rule code, e.g. MB101")
    _rules_opt(q)
    _common(q)
    q = rsub.add_parser("lint", help="check the catalogue: schema, duplicate codes, anchors, every rule's examples")
    _rules_opt(q)
    q.add_argument("--only-user", action="store_true", help="lint only the --rules folders, not the built-in catalogue")
    _common(q)

    p = sub.add_parser("replay", help="replay a config through the validator, with overrides")
    p.add_argument("config", metavar="CONFIG", help="run_config.yaml, a Bridge YAML, a Megatron-LM args dump, or a log")
    _set_opt(p)
    p.add_argument("--bridge-version", type=_release, metavar="X.Y.Z",
                   help="validate as this Megatron-Bridge release (default: the one the config or log shows, "
                        "else 0.5.0-0.6.x)")
    p.add_argument("--gpus", type=_gpu_count, metavar="N", help="world size (default: from the config or 1)")
    _format(p, ("text", "json"))
    _common(p)

    p = sub.add_parser("check", help="pre-flight: will this config fail validation or run out of memory?")
    p.add_argument("config", metavar="CONFIG",
                   help="run_config.yaml, a recipe YAML dump, or a Megatron-LM argument list")
    p.add_argument("--gpus", type=_gpu_count, required=True, metavar="N", help="number of GPUs the job will use")
    _gpu_opts(p)
    _set_opt(p)
    p.add_argument("--bridge-version", type=_release, metavar="X.Y.Z",
                   help="validate as this Megatron-Bridge release")
    _format(p, ("text", "json"))
    _common(p)

    p = sub.add_parser("tui", help="triage in a terminal UI")
    p.add_argument("paths", nargs="*", metavar="LOG", help="log(s) to open; none opens a paste screen; - reads stdin")
    p.add_argument("--slurm", action="store_true", help="start with the list of recent failed Slurm jobs")
    p.add_argument("--follow", "-f", action="store_true",
                   help="follow one growing log (tail -f): new lines appear, the diagnosis is redone when failure "
                   "lines arrive")
    p.add_argument("--since", metavar="AGE", help="with --slurm: how far back (default 1d); with --fleet (7d)")
    p.add_argument("--fleet", metavar="STORE", help="start with the fleet screen of a store (diagnose fleet scan)")
    p.add_argument("--user", metavar="USER", help="with --slurm: whose jobs (default: you)")
    p.add_argument("--check", metavar="CONFIG",
                   help="open the memory plan and what-if editor for a config (run_config.yaml, a recipe YAML dump, "
                   "a Megatron-LM argument list) instead of logs")
    p.add_argument("--gpus", type=_gpu_count, metavar="N",
                   help="with --check: number of GPUs (default: the config's world size)")
    _gpu_opts(p, "with --check: ")
    _set_opt(p)
    p.add_argument("--bridge-version", type=_release, metavar="X.Y.Z",
                   help="with --check: validate as this Megatron-Bridge release")
    _rules_opt(p)
    _common(p)

    p = sub.add_parser("slurm", help="diagnose a Slurm job by id, or list recent failed jobs")
    p.add_argument("jobid", nargs="?", metavar="JOBID", help="e.g. 123456, 123456_7 (array task), 123456+1 (het)")
    p.add_argument("--step", metavar="STEP", help="only this step (e.g. 0, batch)")
    p.add_argument("--follow", action="store_true", help="tail a running job's output and report the first failure")
    p.add_argument("--failed", action="store_true", help="list recent failed jobs with a one-line diagnosis each")
    p.add_argument("--since", default="1d", metavar="AGE", help="with --failed: how far back (e.g. 6h, 2d; default 1d)")
    p.add_argument("--user", metavar="USER", help="with --failed: whose jobs (default: you)")
    p.add_argument("--parsable", "-p", action="store_true",
                   help="with --failed: '|'-separated fields, as sacct --parsable2 (JobID|JobName|User|State|End|...)")
    p.add_argument("--noheader", "-n", action="store_true", help="with --failed: no header line, as sacct -n")
    p.add_argument("--fields", metavar="FIELD,...",
                   help="with --failed: the columns, as sacct -o/--format takes them (NAME or NAME%%WIDTH): JobID, "
                   "JobName, User, State, ExitCode, Start, End, Elapsed, Timelimit, NNodes, NodeList, GPUs, MaxRSS, "
                   "CPUEff, GPUHoursLost, WorkDir, RootCause, Category, Diagnosis, Log (-o stays --output)")
    _rules_opt(p)
    _format(p)
    _common(p)

    p = sub.add_parser("verify", help="check that a finished run really trained with Megatron FSDP",
                       description="Check a finished run's log: Megatron FSDP really active (wrapper, strategy, DP "
                       "size), loss finite to the last iteration, checkpoint written in fsdp_dtensor, and the "
                       "performance fallbacks that happened. Exit 0 only when every check holds.")
    p.add_argument("paths", nargs="+", metavar="LOG",
                   help="log file(s), a folder of per-rank logs, .gz, or - for stdin")
    _format(p, ("text", "json"))
    _rules_opt(p)
    p.add_argument("--config", metavar="FILE", help="the job's run_config.yaml, if not in the log")
    p.add_argument("--bridge-version", metavar="X.Y.Z", help="Megatron-Bridge release the job ran (default: inferred)")
    p.add_argument("--strict", action="store_true", help="a warning (performance fallback) fails the run too")
    _common(p)

    p = sub.add_parser("mcp", help="serve the diagnose tools to a coding agent (Model Context Protocol, stdio)",
                       description="Run an MCP server on stdin/stdout with the tools analyze, verify, check, replay "
                       "and slurm, each returning the command's JSON. Read-only. Needs: pip install mcp.")
    _common(p)

    _fleet_parser(sub)

    p = sub.add_parser("schema",
                       help="print the JSON Schema of a --format json output (report, check, replay, verify, fleet)",
                       description="Print the JSON Schema (draft 2020-12) of 'analyze/slurm --format json' "
                       "(report), 'check --format json' (check), 'replay --format json' (replay), "
                       "'verify --format json' (verify), 'fleet report --format json' (fleet) or "
                       "'slurm --failed --format json' (failed).")
    p.add_argument("name", nargs="?", default="report",
                   choices=("report", "check", "replay", "verify", "fleet", "failed"),
                   help="which (default: report)")
    p.add_argument("--output", "-o", metavar="FILE", help="write the schema to FILE instead of stdout")
    _common(p)

    p = sub.add_parser("completion", help="print a shell completion script (bash, zsh)",
                       description="Print a completion script: eval \"$(diagnose completion bash)\" in ~/.bashrc.")
    p.add_argument("shell", choices=("bash", "zsh"), help="the shell")
    p.add_argument("--output", "-o", metavar="FILE", help="write it to FILE instead of stdout")
    _common(p)
    p = sub.add_parser("man", help="print the man page (roff): diagnose man > diagnose.1",
                       description="Print the man page, generated from these options.")
    p.add_argument("--output", "-o", metavar="FILE", help="write it to FILE instead of stdout")
    _common(p)

    return parser


def _fleet_parser(sub) -> None:
    p = sub.add_parser("fleet", help="diagnose every job of a cluster into a store; report what recurs",
                       description="Fleet diagnosis: scan logs or Slurm accounting into a SQLite store (also as a "
                       "Slurm array, or from Slurm's epilog), then report classes, nodes, users, configs.")
    fsub = p.add_subparsers(dest="fleet_command", metavar="ACTION", parser_class=_Parser, required=True)

    def store_opt(q: argparse.ArgumentParser) -> None:
        q.add_argument("--store", default="fleet.db", metavar="DB", help="the SQLite store (default: fleet.db)")

    def source_opts(q: argparse.ArgumentParser) -> None:
        q.add_argument("paths", nargs="*", metavar="LOG", help="log files or folders (each file is one job)")
        q.add_argument("--sacct", action="store_true", help="the jobs that ended in the window, from sacct")
        q.add_argument("--since", default="7d", metavar="AGE", help="with --sacct: how far back (default 7d)")
        q.add_argument("--user", metavar="USER", help="with --sacct: only this user's jobs (default: all users)")
        q.add_argument("--name", metavar="NAMES", help="with --sacct: only jobs with these names (comma-separated)")
        q.add_argument("--start", metavar="TIME", help="with --sacct: a fixed window start (sacct -S), not --since")
        q.add_argument("--end", metavar="TIME", help="with --sacct: the window end (sacct -E; default now)")
        q.add_argument("--gpus-per-node", type=int, default=8, metavar="N",
                       help="GPUs per node when sacct's AllocTRES has no gres/gpu (default 8)")

    q = fsub.add_parser("scan", help="diagnose every job not yet in the store")
    source_opts(q)
    q.add_argument("--manifest", metavar="FILE", help="a file listing one log path per line")
    q.add_argument("--shard", metavar="I/N", help="take only shard I of N (Slurm array tasks)")
    q.add_argument("--jobs", "-j", type=int, default=0, metavar="N", help="worker processes (default: all cores)")
    q.add_argument("--batch", type=int, default=64, metavar="N", help="jobs per committed transaction (default 64)")
    q.add_argument("--replay", action="store_true", help="also run config replay and the memory model per job")
    q.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    _rules_opt(q)
    store_opt(q)
    _common(q)

    q = fsub.add_parser("submit", help="run the scan as a Slurm array job (one shard per task), then merge")
    source_opts(q)
    q.add_argument("--tasks", type=int, default=4, metavar="N", help="array tasks (default 4)")
    q.add_argument("--run-dir", default="fleet-run", metavar="DIR", help="scripts, shards (default fleet-run)")
    q.add_argument("--sbatch-arg", action="append", default=[], metavar="OPT",
                   help="an extra #SBATCH option, e.g. --partition=cpu; repeatable")
    q.add_argument("--no-merge", action="store_true", help="do not submit the dependent merge job")
    q.add_argument("--dry-run", action="store_true", help="write the scripts, submit nothing")
    store_opt(q)
    _common(q)

    q = fsub.add_parser("merge", help="fold shard stores into the store")
    q.add_argument("shards", nargs="+", metavar="SHARD", help="shard stores (fleet-run/shard-*.db)")
    q.add_argument("--missing-ok", action="store_true", help="skip shards that do not exist (a failed task)")
    store_opt(q)
    _common(q)

    q = fsub.add_parser("report", help="classes, GPU-hours, nodes, users, configs over a window")
    q.add_argument("--since", default="7d", metavar="AGE", help="window: 7d, 12h, 2w (default 7d)")
    q.add_argument("--alpha", type=float, default=0.01, help="family-wise error rate of the node test (default 0.01)")
    q.add_argument("--min-failures", type=int, default=3, metavar="K", help="flag a node only with K+ failures (3)")
    q.add_argument("--format", "-f", choices=("text", "json", "markdown"), default="text")
    q.add_argument("--output", "-o", metavar="FILE", help="write the report to FILE instead of stdout")
    store_opt(q)
    _common(q)

    q = fsub.add_parser("epilog", help="diagnose the ending job named by Slurm's epilog environment (SLURM_JOB_ID)")
    q.add_argument("--comment", action="store_true", help="put the one-line verdict into the job's comment")
    q.add_argument("--gpus-per-node", type=int, default=8, metavar="N", help="GPUs per node (default 8)")
    store_opt(q)
    _common(q)


def _never_fail_to_encode() -> None:
    """A terminal or pipe whose encoding is not UTF-8 (``PYTHONIOENCODING=ascii``, a Latin-1 locale, a Windows
    console) made every report an "internal error: UnicodeEncodeError" on its first "·": what the encoding lacks
    is written as a backslash escape instead (in JSON, inside a string, that is the same character)."""
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "").replace("_", "")
        if encoding and encoding not in ("utf8", "utf8sig") and hasattr(stream, "reconfigure"):
            with contextlib.suppress(ValueError, OSError):
                stream.reconfigure(errors="backslashreplace")


MAX_COLUMNS = 10_000


def _sane_columns() -> None:
    """Cap $COLUMNS, which rich lays every console out at: COLUMNS=999999999 made ``analyze`` take 51 s and 1 GiB
    and ``rules show`` never end (5000 digits would not even convert)."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and (len(columns) > len(str(MAX_COLUMNS)) or int(columns) > MAX_COLUMNS):
        os.environ["COLUMNS"] = str(MAX_COLUMNS)


_OWN_TERMINAL = frozenset({"tui", "mcp"})


def main(argv: list[str] | None = None) -> int:
    _never_fail_to_encode()
    _sane_columns()
    parser = build_parser()
    try:
        args = _parse(parser, argv)
    except SystemExit as e:  # a usage error (already printed, one line), --help or --version
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if not args.command:
        parser.print_help(sys.stderr)  # usage on stderr, exit 2: the output stream stays for reports
        return EXIT_USAGE
    if getattr(args, "output", None) == "-":  # `-o -` is standard output, as for sort/curl (not a file named "-")
        args.output = None
    name = args.command
    debug = getattr(args, "debug", False) or os.environ.get("DIAGNOSE_DEBUG") == "1"
    try:
        _refuse_output_over_input(args)
        if sys.stdout is None and not getattr(args, "output", None):
            from diagnose.model import DiagnoseError

            raise DiagnoseError("standard output is closed: nowhere to write (use -o FILE)")
        module = importlib.import_module(f"diagnose.present.commands.{name}")
        if name in _OWN_TERMINAL:  # the TUI draws on the terminal, the MCP server speaks on stdio: left as they are
            return int(module.run(args))
        from diagnose.present.output import pipe_tolerant_stdout

        with pipe_tolerant_stdout():
            return int(module.run(args))
    except KeyboardInterrupt as e:  # ^C, or SIGTERM in the supervised worker (supervise.Terminated)
        from diagnose.present.supervise import stopped

        return stopped(e)
    except BrokenPipeError:
        # stdout closed early (e.g. `| head`): not an error of ours
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        return EXIT_OK
    except Exception as e:  # noqa: BLE001 - the one place that turns any error into one line
        from diagnose.model import DiagnoseError

        if debug:
            raise
        if isinstance(e, OSError) and e.errno in _WRITE_ERRNOS:
            from diagnose.present.output import silence_stdout

            print(f"diagnose: error: cannot write the output: {e.strerror or e}", file=sys.stderr)
            silence_stdout()
        elif isinstance(e, DiagnoseError):
            from diagnose.ingest.errors import shown

            # one line, inert: many messages name a path or a value as the user gave it (``ru\x01n.yaml is not
            # valid YAML``, found by tests/fuzz/fuzz_cli.py), and a name may hold control characters
            print(f"diagnose: error: {shown(str(e))}", file=sys.stderr)
        else:
            print(f"diagnose: internal error: {type(e).__name__}: {_one_line(str(e))} (rerun with --debug for "
                  "details)", file=sys.stderr)
        return EXIT_USAGE


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse; an option the sub-command does not know is reported by that sub-command's parser (its usage, its
    --help), not by the top-level one. Defaults come from a config file when there is one (userconfig.py)."""
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "command", None) and not extra:
        args = _with_config_defaults(parser, args, argv)
    if extra:
        sub = _subparser(parser, args)
        (sub or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _with_config_defaults(parser: argparse.ArgumentParser, args: argparse.Namespace,
                          argv: list[str] | None) -> argparse.Namespace:
    from diagnose.present import userconfig

    try:
        defaults = userconfig.defaults_for(args.command, userconfig.find_config())
    except Exception as e:  # noqa: BLE001 - one line, like any usage error
        parser.exit(EXIT_USAGE, f"diagnose: error: {_one_line(str(e))}\n")
    sub = _subparser(parser, args)
    if not defaults or sub is None:
        return args
    choices = {a.dest: a.choices for a in sub._actions if a.choices}
    for dest, value in defaults.items():
        if dest in choices and value not in choices[dest]:
            parser.exit(EXIT_USAGE, f"diagnose: error: config file: {dest} must be one of {', '.join(choices[dest])}\n")
    sub.set_defaults(**{k: v for k, v in defaults.items() if any(a.dest == k for a in sub._actions)})
    return parser.parse_args(argv)


def _subparser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser | None:
    found = None
    for name in ("command", "rules_command"):
        value = getattr(args, name, None)
        if not value:
            break
        current = found or parser
        actions = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        if not actions or value not in actions[0].choices:
            break
        found = actions[0].choices[value]
    return found


def entry() -> int:
    """The console script and ``python -m diagnose``: ``main`` in a supervised child (see present/supervise.py)."""
    from diagnose.present.supervise import supervised

    return supervised(main)


def _inputs(args: argparse.Namespace) -> list[str]:
    """Every path a command reads: logs, folders, the config, user rule files."""
    found: list[str] = []
    for attr in ("paths", "config", "rules"):
        value = getattr(args, attr, None)
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, list):
            found.extend(v for v in value if isinstance(v, str))
    return [p for p in found if p and p != "-"]


def _refuse_output_over_input(args: argparse.Namespace) -> None:
    """Refuse ``-o`` naming a file the command reads (or one inside a folder it reads).

    The report is written after the input was read, so ``-o job.log`` would silently replace the only copy of a
    failed job's log (or ``check cfg.yaml -o cfg.yaml`` the config) with the report.
    """
    out = getattr(args, "output", None)
    if not out or not os.path.exists(out):
        return
    from diagnose.ingest.errors import shown
    from diagnose.model import DiagnoseError
    from diagnose.present.output import is_input

    if "-" in (getattr(args, "paths", None) or []) and _stdin_is(out):
        raise DiagnoseError(f"--output {shown(out)} is the file on standard input; write the report elsewhere")
    if is_input(out, _inputs(args)):
        raise DiagnoseError(f"--output {shown(out)} is one of the inputs; write the report elsewhere")


def _stdin_is(path: str) -> bool:
    """Is standard input redirected from ``path`` (``diagnose analyze - -o job.log < job.log``)?"""
    try:
        st_in, st_out = os.fstat(0), os.stat(path)
    except (OSError, ValueError):
        return False
    return (st_in.st_dev, st_in.st_ino) == (st_out.st_dev, st_out.st_ino)


def _one_line(s: str, limit: int = 300) -> str:
    s = " ".join(s.split())
    s = "".join(ch if ch.isprintable() else "?" for ch in s)
    return s if len(s) <= limit else s[: limit - 1] + "…"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(entry())
