"""QA round 9 (docs/qa-report-9.md): a hostile new user of the whole product, from zero.

Each test failed on the tree before its fix. Output tests run the real command line (``python -m diagnose``) as a
subprocess on small logs shaped as the corpus logs read; catalogue tests read ``load_catalogue()``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str, code: tuple[int, ...] = (0, 1)) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "160", "DIAGNOSE_SKIP_SLURM": "1",
           "DIAGNOSE_NO_CONFIG": "1"}
    proc = subprocess.run([sys.executable, "-m", "diagnose", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=180)
    assert proc.returncode in code, proc.stderr
    return proc


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# Megatron-LM 0.9+ world line: an encoder's sizes follow the job's own
MLM_WORLD = ("using world size: 8, data-parallel size: 2, context-parallel size: 1, hierarchical context-parallel "
             "sizes: None, tensor-model-parallel size: 2, encoder-tensor-model-parallel size: 0, "
             "pipeline-model-parallel size: 2, encoder-pipeline-model-parallel size: 0\n")
MLM_FAILURE = """\
------------------------ arguments ------------------------
  num_layers ...................................... 24
  hidden_size ..................................... 4096
  num_attention_heads ............................. 32
  sequence_parallel ............................... True
  recompute_granularity ........................... full
  recompute_method ................................ uniform
  recompute_num_layers ............................ 5
-------------------- end of arguments ---------------------
[rank0]: Traceback (most recent call last):
[rank0]:   File "/workspace/Megatron-LM/pretrain_gpt.py", line 236, in forward_step
[rank0]:   File "/workspace/Megatron-LM/megatron/core/transformer/transformer_block.py", line 473, in _checkpointed_forward
[rank0]:   File "/workspace/Megatron-LM/megatron/core/transformer/transformer_block.py", line 372, in _get_layer
[rank0]:     return self.layers[layer_number]
[rank0]:   File "/usr/local/lib/python3.12/dist-packages/torch/nn/modules/container.py", line 316, in _get_abs_string_index
[rank0]:     raise IndexError(f"index {idx} is out of range")
[rank0]: IndexError: index 12 is out of range
"""


def test_megatron_lm_world_line_reads_the_jobs_tp_not_the_encoders(tmp_path: Path) -> None:
    """cd-megatron-recompute-...: the world line's ``encoder-tensor-model-parallel size: 0`` was read as the job's TP,
    so the replay 'found' TP 0 and told a TP 2 job to run on TP 1 without sequence parallelism."""
    log = write(tmp_path, "mlm.log", MLM_WORLD + MLM_FAILURE)
    report = json.loads(run("analyze", "--format", "json", str(log)).stdout)
    values = report["config"]["values"]
    assert values["model.tensor_model_parallel_size"]["value"] == 2
    assert values["model.pipeline_model_parallel_size"]["value"] == 2
    replay = report.get("replay") or {}
    assert not any("model.tensor_model_parallel_size" in v["keys"] for v in replay.get("violations", []))
    assert "--tensor-model-parallel-size 1" not in run("analyze", str(log)).stdout
