"""QA round 20 (docs/qa-report-20.md): each test failed on the tree before its fix; CLI output through cli_run.
The Slurm tests run on the REAL local cluster (scripts/slurm-local.sh), marked like tests/test_slurm_cluster.py."""

from __future__ import annotations

from cli_run import ROOT, run


def _words(text: str) -> str:
    return " ".join(text.split())


def test_tp_job_with_moe_a2a_overlap_is_not_told_by_the_note_it_must_export_one(tmp_path):
    """qa-report-19 L11: `check` of a TP 2 Megatron-LM list with --overlap-moe-expert-parallel-comm and no
    CUDA_DEVICE_MAX_CONNECTIONS given: the FSDP plans' note said the job "must export 1 on GPUs before Blackwell".
    Megatron-LM's `elif args.overlap_moe_expert_parallel_comm` only warns there (the validator already knew). The
    FSDP plans still need the variable unset or > 1, so they are still named; without the overlap the words stay."""
    args = (ROOT / "examples" / "mlm_args.txt").read_text(encoding="utf-8")
    moe = " --num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall"
    path = tmp_path / "moe.txt"
    path.write_text(args.strip() + moe + " --overlap-moe-expert-parallel-comm\n", encoding="utf-8")
    out = _words(run("check", str(path), "--gpus", "8", "--gpu", "h100-80gb").stdout)
    assert "also need CUDA_DEVICE_MAX_CONNECTIONS unset or > 1 (e.g. 32): Megatron-LM refuses 1 with FSDP" in out
    assert "must export 1" not in out
    assert "with --overlap-moe-expert-parallel-comm this TP/CP > 1 job does not need 1" in out
    plain = tmp_path / "plain.txt"
    plain.write_text(args.strip() + moe + "\n", encoding="utf-8")
    assert "must export 1 on GPUs before Blackwell" in _words(run("check", str(plain), "--gpus", "8", "--gpu",
                                                                  "h100-80gb").stdout)
