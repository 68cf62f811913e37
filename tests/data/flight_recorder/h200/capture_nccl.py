"""Capture PyTorch flight-recorder dumps from a one-rank NCCL process group on a GPU (see README.md here).

Modes (each a fresh process; the environment is set by the caller, see README.md):
- ``dumps OUTDIR``: a few collectives of different ops, sizes and dtypes on the default group and on a second
  group, then the recorder dumped through torch's own functions: ``_dump_nccl_trace`` (pickle) and
  ``_dump_nccl_trace_json`` (JSON), and the generic ``_dump_fr_trace`` / ``_dump_fr_trace_json`` when present.
  Writes ``OUTDIR/<prefix>.pkl`` / ``.json`` and ``OUTDIR/<prefix>_summary.json`` (what was found in the pickle).
- ``timeout OUTDIR``: an all-reduce queued behind a long ``torch.cuda._sleep`` kernel on a group with a 5 s
  timeout: ProcessGroupNCCL's watchdog times it out, dumps the recorder to ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``
  (with ``TORCH_NCCL_DUMP_ON_TIMEOUT=1``) and tears the process down. The caller captures stderr.
"""

from __future__ import annotations

import datetime
import json
import os
import pickle
import sys
import time

import torch
import torch.distributed as dist


def _init(timeout_s: float | None = None) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    torch.cuda.set_device(0)
    kwargs = {"timeout": datetime.timedelta(seconds=timeout_s)} if timeout_s else {}
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0), **kwargs)


def _collectives() -> None:
    dev = torch.device("cuda", 0)
    x = torch.ones(1 << 20, device=dev)  # 4 MiB fp32
    dist.all_reduce(x)
    y = torch.empty(1 << 16, device=dev, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(y, torch.ones(1 << 16, device=dev, dtype=torch.bfloat16))
    z = torch.empty(4096, device=dev)
    dist.reduce_scatter_tensor(z, torch.ones(4096, device=dev))
    dist.broadcast(torch.arange(1000, device=dev), src=0)
    out = torch.empty(8192, device=dev, dtype=torch.bfloat16)
    dist.all_to_all_single(out, torch.ones(8192, device=dev, dtype=torch.bfloat16))
    work = dist.all_reduce(torch.ones(3, 5, device=dev), op=dist.ReduceOp.MAX, async_op=True)
    work.wait()
    dist.barrier()
    group = dist.new_group([0])
    dist.all_reduce(torch.ones(256, device=dev, dtype=torch.float16), group=group)
    dist.all_gather([torch.empty(128, device=dev)], torch.ones(128, device=dev), group=group)
    torch.cuda.synchronize()


def _describe(obj, depth: int = 0):
    """Keys and types, a few levels down: what a reader of this dump has to expect."""
    if isinstance(obj, dict):
        return {str(k): _describe(v, depth + 1) if depth < 2 else type(v).__name__ for k, v in obj.items()}
    if isinstance(obj, list):
        return [f"list of {len(obj)}", _describe(obj[0], depth + 1) if obj and depth < 2 else None]
    return type(obj).__name__


def dumps(outdir: str) -> None:
    _init()
    _collectives()
    c10d = torch._C._distributed_c10d
    found = {n: hasattr(c10d, n) for n in ("_dump_nccl_trace", "_dump_nccl_trace_json", "_dump_fr_trace",
                                           "_dump_fr_trace_json")}
    prefix = os.environ.get("CAPTURE_PREFIX", "nccl_dump")
    summary: dict = {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                     "gpu": torch.cuda.get_device_name(), "functions": found,
                     "env": {k: v for k, v in os.environ.items() if k.startswith(("TORCH_NCCL", "TORCH_FR", "NCCL_"))}}
    if found["_dump_nccl_trace"]:
        raw = c10d._dump_nccl_trace(includeCollectives=True, includeStackTraces=True, onlyActive=False)
        with open(os.path.join(outdir, f"{prefix}.pkl"), "wb") as fh:
            fh.write(raw)
        data = pickle.loads(raw)  # our own dump, just written by this process
        summary["pickle"] = {"bytes": len(raw), "top_level_keys": sorted(data), "version": data.get("version"),
                             "entries": len(data.get("entries", [])), "structure": _describe(data)}
    if found["_dump_nccl_trace_json"]:
        text = c10d._dump_nccl_trace_json(includeCollectives=True, onlyActive=False)
        summary["json_return_type"] = type(text).__name__  # torch 2.11 returns bytes, not str
        with open(os.path.join(outdir, f"{prefix}.json"), "wb") as fh:
            fh.write(text if isinstance(text, bytes) else text.encode())
        data = json.loads(text)
        summary["json"] = {"bytes": len(text), "top_level_keys": sorted(data), "version": data.get("version"),
                           "entries": len(data.get("entries", [])), "structure": _describe(data)}
    if found["_dump_fr_trace"]:
        raw = c10d._dump_fr_trace(includeCollectives=True, includeStackTraces=True, onlyActive=False)
        with open(os.path.join(outdir, f"{prefix}_generic.pkl"), "wb") as fh:
            fh.write(raw)
        summary["generic_pickle"] = {"bytes": len(raw), "entries": len(pickle.loads(raw).get("entries", []))}
    if found["_dump_fr_trace_json"]:
        text = c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False)
        with open(os.path.join(outdir, f"{prefix}_generic.json"), "wb") as fh:
            fh.write(text if isinstance(text, bytes) else text.encode())
        summary["generic_json"] = {"bytes": len(text), "entries": len(json.loads(text).get("entries", []))}
    with open(os.path.join(outdir, f"{prefix}_summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1, default=str)
    print(json.dumps({k: v for k, v in summary.items() if k != "env"}, default=str)[:3000], flush=True)
    dist.destroy_process_group()


def timeout(outdir: str) -> None:
    _init(timeout_s=5)
    _collectives()
    seconds = float(os.environ.get("CAPTURE_SLEEP_S", "60"))
    print(f"{time.strftime('%H:%M:%S')} collectives done; queueing an all_reduce behind a {seconds:.0f} s kernel",
          flush=True)
    torch.cuda._sleep(int(seconds * 2.0e9))  # at ~2 GHz: the stream is busy, the all-reduce cannot start
    x = torch.ones(1 << 18, device="cuda")
    dist.all_reduce(x)
    print(f"{time.strftime('%H:%M:%S')} all_reduce enqueued; waiting", flush=True)
    torch.cuda.synchronize()  # the watchdog fires meanwhile
    print(f"{time.strftime('%H:%M:%S')} synchronize returned (the watchdog did not end the process)", flush=True)
    time.sleep(30)


if __name__ == "__main__":
    mode, outdir = sys.argv[1], sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    {"dumps": dumps, "timeout": timeout}[mode](outdir)
