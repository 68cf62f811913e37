#!/usr/bin/env bash
# Captures that need no GPU: Megatron-Bridge's ConfigContainer.validate() runs before torch.distributed and CUDA are
# touched, and import failures happen before anything else. Run on any x86-64 Linux machine with Python 3.12:
#
#   SITE_OLD=/path/to/site-0.4.2 SITE_NEW=/path/to/site-0.6.2 ./captures_cpu.sh
#
# SITE_OLD: megatron-bridge 0.4.2 + megatron-core 0.17.1 (+ omegaconf, hydra-core, antlr4 4.9.3) installed with
# `pip install --no-deps --target`; SITE_NEW: megatron-bridge 0.6.2 + megatron-core 0.19.2 (same helpers). torch,
# transformers 5.12.1, einops, pyyaml, tensorboard, pillow in the Python that `python3`/`torchrun` run.
set -u
here=$(cd "$(dirname "$0")" && pwd)
cap=$here/run_capture.sh
old=${SITE_OLD:?} new=${SITE_NEW:?}
fsdp="ddp.use_megatron_fsdp=true ddp.data_parallel_sharding_strategy=optim_grads_params"
t="torchrun --nproc_per_node=2 bridge_run.py --size tiny"

# Megatron FSDP with a checkpoint directory and the recipe's default torch_dist format (old and new wording).
$cap b042_mfsdp_ckpt_format_old "$old" 300 $t $fsdp
$cap b062_mfsdp_ckpt_format_new "$new" 300 $t $fsdp
# fsdp_dtensor format asked for without Megatron FSDP.
$cap b042_dtensor_without_mfsdp "$old" 300 $t checkpoint.ckpt_format=fsdp_dtensor
$cap b062_dtensor_without_mfsdp "$new" 300 $t checkpoint.ckpt_format=fsdp_dtensor
# CUDA_DEVICE_MAX_CONNECTIONS=1 exported (a TP-tuned job script) with Megatron FSDP: asserted from 0.5 on.
CUDA_DEVICE_MAX_CONNECTIONS=1 $cap b062_cuda_max_connections "$new" 300 $t $fsdp checkpoint.ckpt_format=fsdp_dtensor
# Megatron FSDP asked for through ddp.*, Torch FSDP2 through dist.*, fsdp_dtensor: the checkpoint assertion fires.
$cap b042_fsdp2_flag_dtensor_assert "$old" 300 $t $fsdp dist.use_torch_fsdp2=true checkpoint.ckpt_format=fsdp_dtensor
$cap b062_fsdp2_flag_dtensor_assert "$new" 300 $t $fsdp dist.use_torch_fsdp2=true checkpoint.ckpt_format=fsdp_dtensor
# Both FSDP implementations switched on through dist.* (run these two one after the other: torchrun's port).
$cap b042_both_fsdp_old "$old" 300 $t dist.use_megatron_fsdp=true dist.use_torch_fsdp2=true
$cap b062_both_fsdp_new "$new" 300 $t dist.use_megatron_fsdp=true dist.use_torch_fsdp2=true
# Import failures: no Transformer Engine, and no placeholder for it (STUB_BLOCK blocks the package outright).
STUB_BLOCK="transformer_engine transformer_engine_torch" $cap b042_import_no_te "$old" 300 torchrun --nproc_per_node=1 bridge_run.py --size tiny
# A node with no GPU visible (CUDA_VISIBLE_DEVICES empty, as on a Slurm step without --gpus): passes validation,
# then stops in initialize_megatron.
CUDA_VISIBLE_DEVICES= $cap b062_no_cuda "$new" 300 torchrun --nproc_per_node=1 bridge_run.py --size tiny checkpoint.save=null
# An override key from the other release (0.6's dataset.seq_length on 0.4.2).
$cap b042_override_key_renamed "$old" 300 $t dataset.seq_length=2048
# async_save with fsdp_dtensor on 0.4.2 (0.5+ accepts it).
$cap b042_async_save_dtensor_old "$old" 300 $t ddp.use_megatron_fsdp=true checkpoint.ckpt_format=fsdp_dtensor checkpoint.async_save=true
# Parallel sizes and batch sizes that do not divide.
$cap b062_world_not_divisible_by_tp "$new" 300 $t model.tensor_model_parallel_size=4
$cap b062_gbs_not_divisible "$new" 300 $t --gbs 3
