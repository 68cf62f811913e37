"""Generate a large, realistic multi-rank Megatron training log (seeded), with the failure near the end.

The body is what a 512-rank job with NCCL_DEBUG=INFO and torchrun's ``--tee`` prefixes writes: NCCL INFO lines
from every rank, Python warnings repeated per rank, Megatron iteration lines from the last rank, memory reports,
timers. The end is the failure: one rank's CUDA OOM traceback in the optimizer step, then the NCCL watchdog timeouts
of the 511 other ranks, then torchrun's ChildFailedError summary.

    python benchmarks/gen_log.py OUT.log --size 1GiB --ranks 512 --seed 7
"""

from __future__ import annotations

import argparse
import random
import sys

NCCL_INFO = [
    "{host}:{pid}:{tid} [{lr}] NCCL INFO Channel {ch:02d}/32 : {a}[{lr}] -> {b}[{lr2}] via P2P/CUMEM/read",
    "{host}:{pid}:{tid} [{lr}] NCCL INFO Connected all rings, use ring PXN 0 GDR 1",
    "{host}:{pid}:{tid} [{lr}] NCCL INFO comm 0x{comm:x} rank {rank} nRanks {n} nNodes {nodes} localRanks 8 localRank {lr} MNNVL 0",
    "{host}:{pid}:{tid} [{lr}] NCCL INFO Using network IB",
    "{host}:{pid}:{tid} [{lr}] NCCL INFO ncclCommInitRankConfig comm 0x{comm:x} rank {rank} nranks {n} cudaDev {lr} nvmlDev {lr} busId {bus:x}000 commId 0x{comm2:x} - Init COMPLETE",
    "{host}:{pid}:{tid} [{lr}] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_3:1/IB ; OOB ib0:10.0.{oct}.{rank8}<0>",
]
WARNINGS = [
    "/opt/venv/lib/python3.12/site-packages/megatron/core/tensor_parallel/layers.py:741: UserWarning: When using sequence parallelism it is recommended to set the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1 for maximum speedup",
    "  warnings.warn(",
    "/opt/venv/lib/python3.12/site-packages/torch/distributed/c10d_logger.py:83: UserWarning: barrier(): using the device under current context.",
]


def _size(text: str) -> int:
    # a bare K/M/G is binary, as head -c, dd and truncate read it ("--size 500M" was a ValueError traceback)
    units = {"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9,
             "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "": 1}
    t = text.strip().upper()
    for u in sorted(units, key=len, reverse=True):
        if u and t.endswith(u):
            return int(float(t[: -len(u)]) * units[u])
    return int(t)


def body_block(rng: random.Random, ranks: int, iteration: int, target: int) -> bytes:
    """About ``target`` bytes of noise: NCCL INFO, warnings, timers, one iteration line per ~2000 lines."""
    out: list[str] = []
    size = 0
    nodes = max(1, ranks // 8)
    while size < target:
        rank = rng.randrange(ranks)
        lr = rank % 8
        host = f"node{rank // 8:04d}"
        r = rng.random()
        if r < 0.80:
            line = rng.choice(NCCL_INFO).format(
                host=host, pid=10000 + rank, tid=20000 + rng.randrange(999), lr=lr, lr2=(lr + 1) % 8,
                ch=rng.randrange(32), a=rank, b=(rank + 1) % ranks, comm=rng.getrandbits(40), comm2=rng.getrandbits(60),
                rank=rank, n=ranks, nodes=nodes, bus=rng.randrange(256), oct=rank // 256, rank8=rank % 256,
            )
        elif r < 0.97:
            line = rng.choice(WARNINGS)
        elif r < 0.999:
            line = f"INFO:megatron.core.timers:(min, max) time across ranks (ms):\n    forward-backward ...............................: ({rng.uniform(900, 1000):.2f}, {rng.uniform(1000, 1100):.2f})"
        else:
            iteration += 1
            line = (
                f" [2026-11-29 15:{iteration // 60 % 60:02d}:{iteration % 60:02d}] iteration {iteration:8d}/  500000 | "
                f"consumed samples: {iteration * 1024:12d} | elapsed time per iteration (ms): {rng.uniform(9000, 9500):.1f} | "
                f"learning rate: 1.500000E-04 | global batch size:  1024 | lm loss: {rng.uniform(2, 3):.6E} | "
                "loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | number of nan iterations:   0 |"
            )
            rank = ranks - 1
        text = f"[default{lr}]:{line}\n" if rng.random() < 0.5 else f"{rank}: {line}\n"
        out.append(text)
        size += len(text)
    return "".join(out).encode()


def failure(ranks: int, oom_rank: int) -> bytes:
    lines: list[str] = []
    p = f"[rank{oom_rank}]: "
    tb = [
        "Traceback (most recent call last):",
        '  File "/workspace/pretrain_gpt.py", line 280, in <module>',
        "    pretrain(train_valid_test_datasets_provider, model_provider, ModelType.encoder_or_decoder, forward_step)",
        '  File "/opt/megatron-lm/megatron/training/training.py", line 1188, in train_step',
        "    update_successful, grad_norm, num_zeros_in_grad = optimizer.step()",
        '  File "/opt/venv/lib/python3.12/site-packages/megatron/core/optimizer/optimizer.py", line 495, in step',
        "    self._step_with_adam()",
        '  File "/opt/venv/lib/python3.12/site-packages/torch/optim/adam.py", line 205, in step',
        "    state['exp_avg'] = torch.zeros_like(p, memory_format=torch.preserve_format)",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 3 has a total capacity of 79.11 GiB "
        "of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.07 GiB memory in use. Of the "
        "allocated memory 74.12 GiB is allocated by PyTorch, and 2.31 GiB is reserved by PyTorch but unallocated. If "
        "reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
        "fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
    ]
    lines += [p + t for t in tb]
    for r in range(ranks):
        if r == oom_rank:
            continue
        lines.append(
            f"[rank{r}]:[E1129 16:{r // 60 % 60:02d}:{r % 60:02d}.123456789 ProcessGroupNCCL.cpp:632] [Rank {r}] "
            f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum=48211, OpType=_REDUCE_SCATTER_BASE, "
            f"NumelIn=402653184, NumelOut=786432, Timeout(ms)=600000) ran for 600047 milliseconds before timing out."
        )
    lines += [
        "E1129 16:40:02.120000 3311 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -6) local_rank: 0 (pid: 3320) of binary: /usr/bin/python",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
        "pretrain_gpt.py FAILED",
        "------------------------------------------------------------",
        "Failures:",
        "  <NO_OTHER_FAILURES>",
        "------------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2026-11-29_16:40:01",
        "  host      : node0000",
        f"  rank      : {oom_rank} (local_rank: {oom_rank % 8})",
        "  exitcode  : 1 (pid: 3323)",
        "  error_file: <N/A>",
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
        "============================================================",
    ]
    return ("\n".join(lines) + "\n").encode()


def generate(path: str, size: int, ranks: int = 512, seed: int = 7, block: int = 32 << 20) -> int:
    """Write ``size`` bytes (about) of log to ``path``; returns the bytes written."""
    rng = random.Random(seed)
    tail = failure(ranks, oom_rank=rng.randrange(ranks))
    # A few distinct blocks, then reused: generating is not what we measure, but lines must not be all alike.
    blocks = [body_block(rng, ranks, i * 1000, min(block, max(1, size))) for i in range(4)]
    written = 0
    with open(path, "wb") as f:
        i = 0
        while True:
            room = size - len(tail) - written
            b = blocks[i % len(blocks)]
            if len(b) > room:
                b = b[: b.rfind(b"\n", 0, max(room, 0)) + 1] if room > 0 else b""
            if not b:
                break
            f.write(b)
            written += len(b)
            i += 1
        f.write(tail)
        written += len(tail)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--size", default="100MiB")
    ap.add_argument("--ranks", type=int, default=512)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args(argv)
    n = generate(a.out, _size(a.size), a.ranks, a.seed)
    print(f"wrote {n} bytes to {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
