"""Hangs from REAL PyTorch flight-recorder dumps: made in this session by ranks on CPU with gloo (2 to 16 ranks,
pickle and JSON), one rank misbehaving each time, read by ``diagnose analyze`` with the ranks' logs.

The dumps are made once per test session (``make_hang.py``: one torch import, ranks forked, all scenarios at once:
about 5 s of CPU). Each scenario is what the issue asks to be named: a stalled rank with its last collective and
frame, a desync, a size mismatch, a dead rank (no dump), and nothing wrong. PyTorch's own analyzer
(``torch.distributed.flight_recorder``) is run on the same dumps and must name the same collective and ranks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diagnose.ingest.flight_recorder import find_dumps, read_dumps
from diagnose.ingest.flight_recorder.discover import DumpFile
from diagnose.ingest.flight_recorder.read import read_dump
from diagnose.match.hang import analyse_dumps
from diagnose.pipeline import AnalyzeOptions, analyze

torch = pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
MAKE = HERE / "data" / "flight_recorder" / "make_hang.py"
H200 = HERE / "data" / "flight_recorder" / "h200"
SCENARIOS = {  # name: (scenario, world, format, bad rank)
    "stall4": ("stall", 4, "pickle", 1),
    "stall4j": ("stall", 4, "json", 2),
    "stall2": ("stall", 2, "pickle", 0),
    "stall16": ("stall", 16, "json", 11),
    "desync3": ("desync", 3, "pickle", 1),
    "size4": ("size", 4, "json", 1),
    "dead4": ("dead", 4, "pickle", 1),
    "ok2": ("ok", 2, "pickle", 1),
}


@pytest.fixture(scope="session")
def dumps_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fr")
    specs = [f"{name}={','.join(map(str, spec))}" for name, spec in SCENARIOS.items()]
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "2000", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(MAKE), str(root), *specs], env=env, capture_output=True, text=True,
                          timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return root


@pytest.fixture(scope="session")
def torchrun_job(tmp_path_factory) -> Path:
    """The issue's case: a 4-rank job under torchrun (its rendezvous, its --log-dir), rank 1 never enters the
    all-reduce the others wait in; the job's own output is job.log, the dumps land beside it."""
    root = tmp_path_factory.mktemp("torchrun")
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "2000", "OMP_NUM_THREADS": "1"}
    with open(root / "job.log", "wb") as log:
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                               "--log-dir", str(root / "logs"), "--redirects", "3", str(MAKE), "--torchrun",
                               str(root), "stall", "pickle", "1"], env=env, stdout=log, stderr=subprocess.STDOUT,
                              timeout=240, check=False)
    assert proc.returncode == 1  # torchrun reports the ranks that failed (the ones that timed out)
    assert len(list(root.glob("nccl_trace_rank_*"))) == 4
    return root


def _analyze(path) -> tuple:
    report = analyze([str(path)], AnalyzeOptions(replay=False))
    return report, report.hang


def _cli_json(path, tmp_path, exit_code: int = 1) -> dict:
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "diagnose", "analyze", "--format", "json", "-o", str(out), str(path)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "DIAGNOSE_SKIP_SLURM": "1"},
                          check=False)
    assert proc.returncode == exit_code, proc.stderr
    return json.loads(out.read_text())


# ------------------------------------------------------------------------------------------ scenarios


def test_stalled_rank_is_named_alone_with_its_last_collective_and_frame(dumps_root):
    report, hang = _analyze(dumps_root / "stall4")
    assert hang.kind == "stalled" and (hang.group, hang.group_desc, hang.seq) == ("0", "default_pg", 4)
    assert hang.op == "gloo:all_reduce" and hang.waiting_ranks == [0, 2, 3] and hang.missing_dumps == []
    [culprit] = hang.culprits
    assert (culprit.rank, culprit.role, culprit.last_op, culprit.last_seq) == (1, "stalled", "all_reduce", 3)
    assert culprit.frame is not None and culprit.frame.startswith(str(MAKE)) and culprit.frame.endswith("in train_step")
    root = report.root
    assert root.rule == "FR001" and root.ranks == [1] and root.category == "nccl_timeout"
    # evidence from both: the dump of the stalled rank and the timeouts in the other ranks' logs
    paths = [e.path for e in root.evidence]
    assert str(dumps_root / "stall4" / "nccl_trace_rank_1") in paths
    assert any(p.endswith("rank0.log") for p in paths) and any("timed out" in e.text for e in root.evidence)
    # the log's own errors (the waiting ranks' timeouts) are consequences of the hang now
    assert all(f.role != "root" for f in report.findings[1:])
    stalled_column = hang.grid[-1]
    assert stalled_column.seq == 4 and {c.rank: c.state for c in stalled_column.cells} == {
        0: "waiting", 1: "absent", 2: "waiting", 3: "waiting"}


def test_torchrun_job_with_dumps_names_the_stalled_rank_the_logs_alone_do_not(torchrun_job):
    logs_only = analyze([str(torchrun_job / "job.log"), str(torchrun_job / "logs")], AnalyzeOptions(replay=False))
    assert logs_only.hang is None and not logs_only.root.rule.startswith("FR")
    report, hang = _analyze(torchrun_job)
    assert hang.kind == "stalled" and [c.rank for c in hang.culprits] == [1] and hang.waiting_ranks == [0, 2, 3]
    assert report.root.rule == "FR001" and report.root.ranks == [1]
    assert hang.culprits[0].frame.endswith("in train_step")
    assert any("attempt_0" in e.path and "timed out" in e.text for e in report.root.evidence)


@pytest.mark.parametrize("name", ["stall4j", "stall2", "stall16"])
def test_stalled_rank_from_2_to_16_ranks_pickle_and_json(dumps_root, name):
    _scenario, world, fmt, bad = SCENARIOS[name]
    report, hang = _analyze(dumps_root / name)
    assert {d.format for d in hang.dumps} == {fmt} and len(hang.dumps) == world
    assert hang.kind == "stalled" and [c.rank for c in hang.culprits] == [bad]
    assert hang.waiting_ranks == [r for r in range(world) if r != bad] and hang.world_size == world
    assert report.root.rule == "FR001" and report.root.ranks == [bad]
    assert (hang.culprits[0].frame is None) == (fmt == "json")  # the JSON dump has no stack frames


def test_desync_names_the_rank_and_the_other_op(dumps_root):
    report, hang = _analyze(dumps_root / "desync3")
    assert hang.kind == "desync" and hang.seq == 4 and hang.op == "gloo:all_reduce"
    [culprit] = hang.culprits
    assert (culprit.rank, culprit.role, culprit.last_op, culprit.last_sizes) == (1, "desync", "broadcast", [[64]])
    assert culprit.frame.endswith("in hang_point")
    assert report.root.rule == "FR002" and "broadcast" in report.root.title


def test_size_mismatch_names_the_rank_and_its_sizes(dumps_root):
    report, hang = _analyze(dumps_root / "size4")
    assert hang.kind == "size_mismatch" and hang.seq == 4 and hang.input_sizes == [[64]]
    odd = [c for c in hang.culprits if c.role == "size_mismatch"]
    assert [(c.rank, c.last_sizes) for c in odd] == [(1, [[96]])]
    # gloo aborts the rank that receives more than it expects: it leaves no dump, its abort is a consequence
    assert all(c.role in ("size_mismatch", "no_dump") for c in hang.culprits)
    assert report.root.rule == "FR003"
    assert "[[96]]" in hang.summary and "[[64]]" in hang.summary


def test_dead_rank_is_called_so(dumps_root, tmp_path):
    doc = _cli_json(dumps_root / "dead4", tmp_path)
    hang = doc["hang"]
    assert hang["kind"] == "dead_rank" and hang["missing_dumps"] == [1] and hang["waiting_ranks"] == [0, 2, 3]
    assert [c["role"] for c in hang["culprits"]] == ["no_dump"]
    root = doc["findings"][doc["root_cause"]]
    assert root["rule"] == "FR004" and root["ranks"] == [1] and "rank 1 left no dump" in root["title"]
    assert [cell["state"] for cell in hang["grid"][-1]["cells"]] == ["waiting", "no_dump", "waiting", "waiting"]


def test_a_dead_last_rank_needs_the_world_size_the_log_states(dumps_root):
    dumps, _ = read_dumps(find_dumps([str(dumps_root / "stall4")]).dumps)
    without_last = [d for d in dumps if d.rank != 3]
    assert analyse_dumps(without_last).kind == "stalled"  # rank 1 still stalled; rank 3 unknown
    hang = analyse_dumps(without_last, world_size=4)
    assert hang.missing_dumps == [3] and [c.rank for c in hang.culprits] == [1, 3]


def test_agreeing_dumps_say_so_and_add_no_finding(dumps_root):
    report, hang = _analyze(dumps_root / "ok2")
    assert hang.kind == "none" and not hang.culprits and report.root is None
    assert not any(f.rule.startswith("FR") for f in report.findings)


def test_text_and_markdown_show_the_hang_and_its_grid(dumps_root):
    from conftest import render_to_string

    from diagnose.present.markdown import render_markdown

    report, _ = _analyze(dumps_root / "stall4")
    text = render_to_string(report, width=120)
    assert "HANG (flight recorder)" in text and "rank 1 (stalled): all_reduce #3 [[64]]" in text
    grid = [line for line in text.splitlines() if line.strip().startswith("rank 1 ")]
    assert grid and grid[-1].split()[-2:] == ["-", "<"]
    md = render_markdown(report)
    assert "### Hang (flight recorder)" in md and "rank 1 " in md


def test_json_report_with_a_hang_validates_against_the_schema(dumps_root, tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((HERE.parent / "schemas" / "report-1.schema.json").read_text())
    for name in ("stall4", "size4", "ok2"):
        doc = _cli_json(dumps_root / name, tmp_path, 0 if name == "ok2" else 1)
        jsonschema.Draft202012Validator(schema).validate(doc)
    doc = _cli_json(dumps_root / "stall4", tmp_path)
    doc["hang"]["kind"] = "frozen"
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(doc))


# ------------------------------------------------------------------------------ PyTorch's own analyzer


def _torch_db(folder: Path, world: int, allow_incomplete: bool = True):
    """PyTorch's analyzer on the same dumps. Its loader uses pickle.load (so: our restricted loader instead) and
    expects pg_config as ProcessGroupNCCL writes it (group name -> ranks); the gloo recorder of torch 2.13 writes
    one empty-named group with no ranks, which its builder cannot index, so that one field is filled in."""
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig

    details = {}
    for f in find_dumps([str(folder)]).dumps:
        raw = Path(f.path).read_bytes()
        if f.format == "json":
            dump = json.loads(raw)
        else:
            from diagnose.ingest.flight_recorder.safe_pickle import load_plain

            dump = load_plain(raw)
        config = {e["process_group"][0]: {"name": e["process_group"][0], "desc": e["process_group"][1],
                                          "ranks": str(list(range(world)))} for e in dump["entries"]}
        details[f.path] = {"host_name": f"host{f.rank}", "rank": f.rank, "entries": dump["entries"],
                           "version": dump["version"], "pg_config": config}
    argv = [str(folder)] + (["--allow-incomplete-ranks"] if allow_incomplete else [])
    return build_db(details, JobConfig().parse_args(argv), "2.10")


@pytest.mark.parametrize("name", ["stall4", "stall16", "desync3", "size4"])
def test_pytorchs_analyzer_names_the_same_collective_and_ranks(dumps_root, name):
    _scenario, world, _fmt, _bad = SCENARIOS[name]
    ours = _analyze(dumps_root / name)[1]
    db = _torch_db(dumps_root / name, world)
    odd = [c for c in db.collectives if c.missing_ranks or c.mismatch_collectives or not c.pass_check]
    first = odd[0]
    assert (first.collective_seq_id, first.pg_desc) == (ours.seq, f"{ours.group}:{ours.group_desc}")
    if ours.kind == "stalled":
        assert first.missing_ranks == {c.rank for c in ours.culprits}
        return
    # PyTorch compares every rank with the first rank that dumped, diagnose with the majority: the same split
    # of the ranks, named from the other side when the first rank is the odd one
    present = {d.rank for d in ours.dumps}
    theirs = set(first.mismatch_collectives)
    mine = {c.rank for c in ours.culprits if c.role == ours.kind}
    assert {frozenset(theirs), frozenset(present - theirs)} == {frozenset(mine), frozenset(present - mine)}


def test_pytorchs_analyzer_also_misses_the_dead_ranks_dump(dumps_root):
    ours = _analyze(dumps_root / "dead4")[1]
    with pytest.raises(AssertionError, match=r"Missing dump files from ranks \{1\}"):
        _torch_db(dumps_root / "dead4", 4, allow_incomplete=False)
    assert ours.missing_dumps == [1]


# -------------------------------------------------------------------------------------- H200 NCCL dumps


def test_nccl_dump_from_an_h200_timeout_reads_and_says_the_collective_never_completed():
    report, hang = _analyze(H200 / "timeout_new_env")
    assert hang.kind == "not_completed" and (hang.seq, hang.op) == (8, "nccl:all_reduce")
    assert hang.waiting_ranks == [0] and hang.dumps[0].version == "2.10"
    assert report.root.rule == "FR005"
    assert any(f.category == "nccl_timeout" and f.role == "cascade" for f in report.findings[1:])


def test_nccl_json_dump_from_an_h200_reads_like_its_pickle():
    pkl = read_dump(DumpFile(str(H200 / "nccl_dump.pkl"), 0, "pickle"))
    js = read_dump(DumpFile(str(H200 / "nccl_dump.json"), 0, "json"))
    key = [(e.group, e.seq, e.op, e.input_sizes) for e in pkl.entries]
    assert key == [(e.group, e.seq, e.op, e.input_sizes) for e in js.entries] and len(key) == 9
    assert js.groups["0"].last_completed == 7 and js.comm_lib_version == "2.28.9"
    assert not js.entries[0].frames and pkl.entries[0].frames[0].name == "all_reduce"


# ---------------------------------------------------------------------------------------------------- TUI


def test_tui_hang_grid_marks_the_stalled_rank(dumps_root):
    import asyncio

    from rich.text import Text
    from textual.widgets import DataTable

    from diagnose.present.tui.app import DiagnoseApp
    from diagnose.present.tui.hangview import HangScreen

    report, hang = _analyze(dumps_root / "stall4")
    log = str(dumps_root / "stall4" / "rank0.log")
    # Which earlier collectives a real dump marks completed depends on when the recorder retired them (a rank's last
    # one can still read as started under load): the grid must show what the analysis found, and the stall itself.
    words = {"completed": ". done", "waiting": "W waiting", "absent": "- NEVER"}
    rank1 = ["▶ rank 1"] + [words.get(c.state, c.state) for col in hang.grid for c in col.cells if c.rank == 1]
    assert rank1[-1] == "- NEVER" and rank1[1] == ". done"

    def row_of(screen: HangScreen, rank: int) -> list[str]:
        """The plain text of one rank's row of the grid."""
        return [c.plain if isinstance(c, Text) else str(c) for c in screen.query_one(DataTable).get_row(str(rank))]

    async def run() -> None:
        app = DiagnoseApp([log], report=report)
        async with app.run_test(size=(140, 40)) as pilot:
            await pilot.pause()
            await pilot.press("g")
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, HangScreen)
            assert row_of(screen, 1) == rank1
            assert row_of(screen, 0)[0] == "  rank 0" and row_of(screen, 0)[-1] == "W waiting"
            summary = str(screen.query_one("#hang-summary").content)
            assert "Rank 1 never entered all_reduce #4" in summary and "train_step" in summary
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, HangScreen)
            await pilot.press("enter")  # the root finding's evidence is a dump: the grid, not a binary "log"
            await pilot.pause()
            assert isinstance(app.screen, HangScreen)

    asyncio.run(run())
