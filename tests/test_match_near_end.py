"""A warning that means failure only when the output stops on it ([rule.context] near_end; LA530).

torch's c10d logs "The IPv6 network addresses of (host, port) cannot be retrieved" for each failed lookup of the
store's host and retries. Once, in a run that goes on to train, it is noise; repeated to the last lines of the log,
the job was still waiting for a store it could not find when its output stopped (round 52's silent log)."""

from __future__ import annotations

import pytest

from diagnose.match.rules import parse_rule
from diagnose.pipeline import AnalyzeOptions, analyze

GAI = ("[W socket.cpp:558] [c10d] The IPv6 network addresses of (trainer-0-0.trainer, 3389) cannot be retrieved "
       "(gai error: -2 - Name or service not known).")
LAUNCH = "+ torchrun --nnodes=2 --nproc-per-node=8 --rdzv-endpoint=trainer-0-0.trainer:3389 train.py"
STEP = " iteration {n:8d}/    2000 | consumed samples: {s:8d} | lm loss: 2.41E+00 | number of nan iterations:   0 |"


def _root(tmp_path, lines: list[str], final_newline: bool = True):
    path = tmp_path / "job.log"
    path.write_text("\n".join(lines) + ("\n" if final_newline else ""))
    report = analyze([str(path)], AnalyzeOptions(replay=False))
    return next((f for f in report.findings if f.role == "root"), None)


@pytest.mark.parametrize("final_newline", [True, False])
def test_a_log_that_ends_retrying_the_lookup_is_the_failure(tmp_path, final_newline):
    root = _root(tmp_path, [LAUNCH] + [GAI] * 30, final_newline)
    assert root is not None and (root.rule, root.category, root.phase) == ("LA530", "launcher", "init")


def test_a_mapped_input_is_read_the_same(tmp_path):
    """Inputs over 1 MiB are memory-mapped (ingest/sources.py), and an mmap has no count(): the first version of
    near_end raised AttributeError there, an internal error on any big log that ends in the retries."""
    filler = [f"I1207 10:00:00.000000 1 train.py:10] loading shard {i} of 40000 from /data/shards" for i in range(40000)]
    root = _root(tmp_path, [LAUNCH] + filler + [GAI] * 30)
    assert root is not None and root.rule == "LA530"
    assert _root(tmp_path, [LAUNCH] + [GAI] * 3 + filler) is None


def test_the_same_warning_before_training_went_on_is_not_a_failure(tmp_path):
    lines = [LAUNCH] + [GAI] * 3 + [STEP.format(n=i, s=64 * i) for i in range(1, 40)]
    assert _root(tmp_path, lines) is None


def test_a_shell_line_among_the_last_retries_does_not_hide_it(tmp_path):
    lines = [LAUNCH] + [GAI] * 20 + ["$ kubectl logs -n train trainer-0-0 | tail -n 4"] + [GAI] * 4
    root = _root(tmp_path, lines)
    assert root is not None and root.rule == "LA530"


def test_near_end_counts_lines_not_bytes_and_refuses_a_bad_value():
    base = {"code": "XX001", "slug": "x", "title": "x", "category": "launcher", "phase": "init", "severity": "error",
            "role": "root", "confidence": 0.5, "patterns": [{"anchor": "boom", "regex": "boom"}],
            "explanation": "x", "fix": {"summary": "x", "safety": "manual"}}
    assert parse_rule({**base, "context": {"near_end": 5}}, "test").context.near_end == 5
    for bad in (-1, 1001, True, "5"):
        with pytest.raises(ValueError, match="near_end"):
            parse_rule({**base, "context": {"near_end": bad}}, "test")
