"""Config extraction from real and documented log formats, files, launch lines and single lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnose.configview import ConfigView
from diagnose.explain.config import load_config
from diagnose.explain.config.cmdline import parse_command
from diagnose.explain.config.extract import blocks_from_lines, from_blocks, lines_of
from diagnose.explain.config.loglines import parse_ddp_repr, parse_env_line
from diagnose.explain.config.version import infer_version
from diagnose.model import DiagnoseError, LogLine

DATA = Path(__file__).parent / "data" / "configs"
REAL = Path(__file__).resolve().parents[2] / "shared" / "real_logs"
B042 = REAL / "b042_first_iter_oom.log"


@pytest.mark.skipif(not B042.exists(), reason="shared real logs not present")
def test_configuration_summary_from_real_bridge_042_log():
    text = B042.read_text()
    view = from_blocks(blocks_from_lines(lines_of(text, str(B042))))
    lineno = {line.split(":")[0].strip(): i for i, line in enumerate(text.splitlines(), 1) if line.startswith("  ")}
    assert view.framework == "megatron-bridge"
    assert view.get("ddp.use_megatron_fsdp") is True
    assert view.get("ddp.data_parallel_sharding_strategy") == "optim_grads_params"
    assert view.get("checkpoint.ckpt_format") == "fsdp_dtensor"
    assert view.get("checkpoint.save") == "/workspace/nemo_experiments/default/checkpoints"
    assert view.get("train.micro_batch_size") == 256
    assert view.get("model.num_layers") == 8 and view.get("model.hidden_size") == 4096
    assert view.get("optimizer.params_dtype") == "bfloat16"
    # the value's origin is the line it was printed on
    assert view.origin("checkpoint.ckpt_format") == f"log:{lineno['ckpt_format']}"
    # dataset.sequence_length feeds model.seq_length; unprinted keys are release defaults
    assert view.get("model.seq_length") == 8192
    assert view.origin("model.tensor_model_parallel_size") == "default"
    assert view.version == ">=0.3.1"


def test_task_configuration_yaml_block_with_rank_prefixes():
    view = load_config(str(DATA / "task_configuration.log"))
    assert view.framework == "megatron-bridge"
    assert view.get("model.tensor_model_parallel_size") == 2
    assert view.get("model.params_dtype") == "bfloat16"  # {_target_: torch.bfloat16, _call_: false}
    assert view.get("ddp.use_megatron_fsdp") is True
    assert view.get("env.CUDA_DEVICE_MAX_CONNECTIONS") == "32"
    assert not any(k.endswith("_target_") for k in view)  # class names are never kept as values
    # each value points at its own line (model.num_layers is line 27 of the file)
    lines = (DATA / "task_configuration.log").read_text().splitlines()
    assert lines[view_line(view, "model.num_layers") - 1].endswith("num_layers: 32")
    assert lines[view_line(view, "env.CUDA_DEVICE_MAX_CONNECTIONS") - 1].endswith("CUDA_DEVICE_MAX_CONNECTIONS: '32'")
    assert lines[view_line(view, "model.params_dtype") - 1].endswith("params_dtype:")
    assert view.version == "<=0.3.0"


def view_line(view: ConfigView, key: str) -> int:
    origin = view.origin(key)
    assert origin and origin.startswith("log:")
    return int(origin[4:])


def test_megatron_lm_arguments_dump_maps_to_bridge_paths():
    view = load_config(str(DATA / "mlm_arguments.log"))
    assert view.framework == "megatron-lm"
    assert view.get("model.tensor_model_parallel_size") == 4
    assert view.get("model.pipeline_model_parallel_size") == 2
    assert view.get("ddp.grad_reduce_in_fp32") is True
    assert view.get("ddp.use_megatron_fsdp") is True and view.get("dist.use_megatron_fsdp") is True
    assert view.get("ddp.use_distributed_optimizer") is True and view.get("optimizer.use_distributed_optimizer") is True
    assert view.get("model.num_query_groups") == 8
    assert view.get("launch.world_size") == 16
    assert view.get("mlm.some_future_argument") == 7
    assert view.get("launch.num_parameters") == 8918654976  # the most loaded rank
    assert view.origin("model.num_layers").startswith("log:")


def test_bridge_run_config_yaml_file():
    view = load_config(str(DATA / "run_config.yaml"))
    assert view.sources == ["file:run_config.yaml"]
    assert view.get("dist.use_torch_fsdp2") is True
    assert view.origin("dist.use_torch_fsdp2") == "file:run_config.yaml"
    assert view.origin("ddp.nccl_ub") == "default"


def test_megatron_lm_argument_list_file(tmp_path):
    p = tmp_path / "args.txt"
    p.write_text("--tensor-model-parallel-size 2 --use-torch-fsdp2 --ckpt-format=torch_dist --num-layers 12\n"
                 "--no-gradient-accumulation-fusion --recompute-modules core_attn mlp --no-save-optim --swiglu\n")
    view = load_config(str(p))
    assert view.framework == "megatron-lm"
    assert view.get("model.tensor_model_parallel_size") == 2
    assert view.get("dist.use_torch_fsdp2") is True
    assert view.get("checkpoint.ckpt_format") == "torch_dist"
    assert view.get("model.gradient_accumulation_fusion") is False
    assert view.get("model.recompute_modules") == ["core_attn", "mlp"]
    assert view.get("checkpoint.save_optim") is False
    assert view.get("model.gated_linear_unit") is True and view.get("model.activation_func") == "silu"


def test_torchrun_line_with_hydra_overrides_and_env_prefix():
    view = ConfigView()
    parse_command(
        "+ CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nproc_per_node=8 --nnodes 4 scripts/training/run_recipe.py "
        "--recipe llama3_8b_pretrain_config -tp 2 -gb 512 ddp.use_megatron_fsdp=true "
        "checkpoint.ckpt_format=torch_dist +model.seq_length=4096",
        "log:7", view,
    )
    assert view.get("launch.world_size") == 32 and view.get("launch.nproc_per_node") == 8
    assert view.get("env.CUDA_DEVICE_MAX_CONNECTIONS") == "1"
    assert view.get("model.tensor_model_parallel_size") == 2
    assert view.get("train.global_batch_size") == 512
    assert view.get("ddp.use_megatron_fsdp") is True
    assert view.get("model.seq_length") == 4096
    assert view.framework == "megatron-bridge"
    assert view.origin("ddp.use_megatron_fsdp") == "log:7"


def test_continued_megatron_lm_launch_line_from_a_log():
    lines = [
        "python -m torch.distributed.run --nproc-per-node 4 pretrain_gpt.py \\",
        "    --tensor-model-parallel-size 4 --sequence-parallel \\",
        "    --use-megatron-fsdp --ckpt-format torch_dist",
        "some later output",
    ]
    view = from_blocks(blocks_from_lines(lines_of("\n".join(lines), "job.log")))
    assert view.framework == "megatron-lm"
    assert view.get("launch.world_size") == 4
    assert view.get("model.sequence_parallel") is True
    assert view.get("ddp.use_megatron_fsdp") is True
    assert view.get("checkpoint.ckpt_format") == "torch_dist"


def test_env_lines_are_assignments_not_hints():
    view = ConfigView()
    hint = ("torch.OutOfMemoryError: CUDA out of memory. ... try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
    assert not parse_env_line(LogLine("x", 1, hint, hint), view)
    assert parse_env_line(LogLine("x", 2, "export PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True'",
                                  "export PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True'"), view)
    assert view.get("env.PYTORCH_CUDA_ALLOC_CONF") == "expandable_segments:True"
    assert view.origin("env.PYTORCH_CUDA_ALLOC_CONF") == "log:2"


def test_ddp_config_repr_line():
    text = ("Setting up DistributedDataParallel with config DistributedDataParallelConfig(grad_reduce_in_fp32=True, "
            "overlap_grad_reduce=False, bucket_size=None, data_parallel_sharding_strategy='optim_grads', "
            "param_name_patterns_for_fp32_local_accumulation=('a', 'b,c'), megatron_fsdp_main_params_dtype=torch.float32)")
    view = ConfigView()
    assert parse_ddp_repr(LogLine("x", 9, text, text), view)
    assert view.get("ddp.grad_reduce_in_fp32") is True
    assert view.get("ddp.bucket_size") is None and view.has("ddp.bucket_size")
    assert view.get("ddp.data_parallel_sharding_strategy") == "optim_grads"
    assert view.get("ddp.megatron_fsdp_main_params_dtype") == "float32"


@pytest.mark.parametrize(
    "texts, expected",
    [
        (["ValueError: Using use_megatron_fsdp and use_torch_fsdp2 at the same time is not supported."], "<=0.4.x"),
        (["AssertionError: Megatron-FSDP requires the fsdp_dtensor checkpointing format!"], ">=0.5.0"),
        (["TypeError: TorchFullyShardedDataParallel.__init__() got an unexpected keyword argument 'pg_collection'",
          'File "/x/megatron/bridge/models/common/unimodal.py", line 233, in _ddp_wrap'], "0.4.0-0.4.2"),
        (["megatron-bridge 0.6.2 | megatron-core 0.19.2"], "0.6.2"),
        (["torch 2.11.0+cu130 | megatron-core 0.16.1 | scenario both_fsdp"], "<=0.4.x"),
        (["nothing to see"], None),
    ],
)
def test_version_inference_from_log_wording(texts, expected):
    assert infer_version(texts)[0] == expected


def test_missing_and_unsupported_config_files_are_one_line_errors(tmp_path):
    with pytest.raises(DiagnoseError, match="not found"):
        load_config(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(DiagnoseError, match="not a Megatron-Bridge config"):
        load_config(str(bad))
    broken = tmp_path / "broken.yaml"
    broken.write_text("model: [1, 2\n")
    with pytest.raises(DiagnoseError, match="not valid YAML"):
        load_config(str(broken))


def test_checkpoint_folders_resolve_to_their_run_config(tmp_path):
    save = tmp_path / "checkpoints"
    for it, layers in ((500, 4), (1000, 8)):
        d = save / f"iter_{it:07d}"
        d.mkdir(parents=True)
        (d / "run_config.yaml").write_text(f"model:\n  num_layers: {layers}\n")
    assert load_config(str(save)).get("model.num_layers") == 8  # highest iteration
    (save / "latest_checkpointed_iteration.txt").write_text("500\n")
    assert load_config(str(save)).get("model.num_layers") == 4  # the tracker wins
    assert load_config(str(save / "iter_0001000")).get("model.num_layers") == 8
    with pytest.raises(DiagnoseError, match="no run_config.yaml"):
        load_config(str(tmp_path))


def test_srun_launching_python_directly_gives_the_world_size():
    view = ConfigView()
    parse_command("srun --nodes=4 --ntasks-per-node=8 python pretrain_gpt.py --tensor-model-parallel-size 8 "
                  "--num-layers 80", "log:3", view)
    assert view.get("launch.world_size") == 32 and view.get("launch.nnodes") == 4
    assert view.get("model.tensor_model_parallel_size") == 8 and view.framework == "megatron-lm"
    other = ConfigView()
    parse_command("srun -N 2 torchrun --nproc_per_node 8 --nnodes 2 train.py model.num_layers=2", "log:4", other)
    assert other.get("launch.world_size") == 16  # torchrun decides, not srun's task count


def test_megatron_lm_moe_mla_mtp_layout_and_fp8_flags_reach_bridge_paths(tmp_path):
    """QA2 #3: these flags stayed mlm.<name>, so the validator said "moe_act ... only supported with
    moe_grouped_gemm" with --moe-grouped-gemm given, and the memory model made every layer MoE."""
    p = tmp_path / "args.txt"
    p.write_text(
        "--num-layers 61 --pipeline-model-parallel-size 16 --moe-grouped-gemm --moe-layer-freq \"([0]*3+[1]*58)\"\n"
        "--mtp-num-layers 1 --pipeline-model-parallel-layout \"Et*3|(tt|)*29,m|L\" --multi-latent-attention\n"
        "--q-lora-rank 1536 --kv-lora-rank 512 --fp8-format hybrid --moe-token-dispatcher-type alltoall\n")
    view = load_config(str(p))
    assert view.get("model.moe_grouped_gemm") is True
    assert view.get("model.moe_layer_freq") == [0] * 3 + [1] * 58
    assert view.get("model.mtp_num_layers") == 1
    assert view.get("model.pipeline_model_parallel_layout") == "Et*3|(tt|)*29,m|L"
    assert view.get("model.multi_latent_attention") is True and view.get("model.q_lora_rank") == 1536
    assert view.get("model.fp8") == "hybrid"
    assert view.get("model.moe_token_dispatcher_type") == "alltoall"


@pytest.mark.parametrize("text,value", [
    ("2", 2), ("([1]*3+[0]*1)*2", [1, 1, 1, 0] * 2), ("[0]+[1]*3", [0, 1, 1, 1]),
    ("__import__('os').system('x')", "__import__('os').system('x')"), ("[1]*99999999", "[1]*99999999"),
])
def test_moe_layer_freq_patterns_are_expanded_never_evaluated(value, text):
    from diagnose.explain.config.mlm_args import moe_freq_value

    assert moe_freq_value(text) == value
