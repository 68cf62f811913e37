"""``[rule.evidence]``: the lines beside the matched one that say why join the finding's evidence.

A summary line (``Error(s) in loading state_dict``, pyxis's ``failed to import docker image``, a bare
``AssertionError``) names the failure; the line that says which key, which registry error or which assert is under
or above it, and the user must see it; the matched line stays first (one-line summaries read it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import analyzed_root as _root

from diagnose.match.rules import parse_rule
from diagnose.pipeline import AnalyzeOptions, analyze


def _lines(finding) -> list[str]:
    return [e.text.strip() for e in finding.evidence]


BARE_ASSERT = """\
loading checkpoint from /ckpt/run7
Traceback (most recent call last):
  File "/opt/app/train.py", line 40, in <module>
    main()
  File "/opt/app/engine.py", line 1919, in _load_checkpoint
    assert len(self.ckpt_list) > 0
AssertionError
"""


def test_a_bare_assertion_shows_the_assert_statement_above_it(tmp_path: Path) -> None:
    root = _root(tmp_path, BARE_ASSERT)
    assert root.rule == "PY002"
    lines = _lines(root)
    # the matched line stays first (one-line summaries read evidence[0]); the statement that raised is under it
    assert lines[:2] == ["AssertionError", "assert len(self.ckpt_list) > 0"]
    assert [e.line for e in root.evidence[:2]] == [7, 6]


def test_a_raise_statement_is_not_shown_it_only_repeats_the_message(tmp_path: Path) -> None:
    text = """\
Traceback (most recent call last):
  File "/opt/app/train.py", line 12, in <module>
    check(cfg)
  File "/opt/app/cfg.py", line 30, in check
    raise ValueError(f"unknown strategy: {name}")
ValueError: unknown strategy: sharegpt
"""
    root = _root(tmp_path, text)
    assert _lines(root) == ["ValueError: unknown strategy: sharegpt"]


def test_a_key_error_shows_the_look_up_that_raised_it(tmp_path: Path) -> None:
    text = """\
Traceback (most recent call last):
  File "/opt/app/train.py", line 12, in <module>
    loss = Loss(hyp)
  File "/opt/app/loss.py", line 88, in __init__
    self.gamma = hyp['fl_gamma']
KeyError: 'fl_gamma'
"""
    root = _root(tmp_path, text)
    assert _lines(root)[:2] == ["KeyError: 'fl_gamma'", "self.gamma = hyp['fl_gamma']"]


STATE_DICT = """\
[rank0]: Traceback (most recent call last):
[rank1]: Traceback (most recent call last):
[rank0]:   File "/opt/app/train.py", line 50, in <module>
[rank1]:   File "/opt/app/train.py", line 50, in <module>
[rank0]:     model.load_state_dict(sd)
[rank1]:     model.load_state_dict(sd)
[rank0]: RuntimeError: Error(s) in loading state_dict for BertModel:
[rank1]: RuntimeError: Error(s) in loading state_dict for BertModel:
[rank1]: 	size mismatch for embeddings.word_embeddings.weight: copying a param with shape torch.Size([0]) from checkpoint, the shape in current model is torch.Size([21128, 1024]).
[rank0]: 	size mismatch for embeddings.word_embeddings.weight: copying a param with shape torch.Size([0]) from checkpoint, the shape in current model is torch.Size([21128, 1024]).
[rank0]: 	size mismatch for embeddings.position_embeddings.weight: copying a param with shape torch.Size([0]) from checkpoint, the shape in current model is torch.Size([512, 1024]).
[rank0]: 	size mismatch for embeddings.token_type_embeddings.weight: copying a param with shape torch.Size([0]) from checkpoint, the shape in current model is torch.Size([2, 1024]).
"""


def test_the_lines_under_a_state_dict_error_say_which_tensors_differ(tmp_path: Path) -> None:
    root = _root(tmp_path, STATE_DICT)
    assert root.rule == "CK009"
    first = [e.line for e in root.evidence]
    # rank 0's error (line 7), then its own two first mismatches (lines 10, 11; not rank 1's line 9): at most two
    assert first[:3] == [7, 10, 11], first
    assert 12 not in first[:3]


def test_pyxis_shows_enroot_s_error_not_its_info_lines(tmp_path: Path) -> None:
    text = """\
srun: job 4242 queued and waiting for resources
slurmstepd: error: pyxis: child 9121 failed with error code: 1
slurmstepd: error: pyxis: failed to import docker image
slurmstepd: error: pyxis: printing enroot log file:
slurmstepd: error: pyxis:     [INFO] Querying registry for permission grant
slurmstepd: error: pyxis:     [INFO] Authenticating with user: <anonymous>
slurmstepd: error: pyxis:     [ERROR] URL https://registry-1.docker.io/v2/library/app/manifests/latest returned error code: 401 Unauthorized
slurmstepd: error: pyxis: couldn't start container
slurmstepd: error: spank: required plugin spank_pyxis.so: task_init() failed with rc=-1
"""
    root = _root(tmp_path, text)
    assert root.rule == "SL018"
    lines = _lines(root)
    assert any("401 Unauthorized" in t for t in lines), lines
    assert not any("[INFO]" in t for t in lines), lines


def _rule(evidence: dict) -> dict:
    return {
        "code": "USR901", "slug": "x", "title": "x", "category": "data", "phase": "init", "severity": "error",
        "role": "root", "confidence": 0.5, "explanation": "x",
        "patterns": [{"anchor": "boom", "regex": "boom"}], "fix": {"summary": "x", "safety": "manual"},
        "evidence": evidence,
    }


@pytest.mark.parametrize("evidence, message", [
    ({"following": "(unclosed"}, "evidence.following does not compile"),
    ({"folowing": "x"}, "evidence: unknown key(s): folowing"),
    ({"raising_code": "yes"}, "'raising_code' must be bool"),
])
def test_a_bad_evidence_table_is_refused_with_its_reason(evidence: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_rule(_rule(evidence), "user.toml")


def test_one_line_answers_name_the_exception_not_the_statement_under_it(tmp_path: Path) -> None:
    """The Slurm one-line diagnosis and the fleet's failure class read the line the rule matched."""
    from diagnose.fleet.record import signature
    from diagnose.present.commands.slurm import one_line_diagnosis

    log = tmp_path / "job.log"
    log.write_text("Traceback (most recent call last):\n  File \"/opt/app/step.py\", line 88, in run\n"
                   "    total = combine(parts)\nValueError: something unexpected happened in my_module\n")
    report = analyze([str(log)], AnalyzeOptions(replay=False))
    assert report.root is not None and report.root.category == "other"
    assert [e.text for e in report.root.evidence][1].strip() == "total = combine(parts)"
    assert one_line_diagnosis(report).endswith("ValueError: something unexpected happened in my_module")
    assert signature(report) == "PY001:ValueError"
