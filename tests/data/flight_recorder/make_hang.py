"""Make REAL flight-recorder dumps of a real hang: N ranks on CPU with gloo, one of them misbehaving.

``python make_hang.py OUTROOT NAME=SCENARIO,WORLD,FORMAT,BAD_RANK ...`` (FORMAT: pickle | json): each scenario in
``OUTROOT/NAME``, all of them at once. The parent imports torch once and forks the ranks (cheaper than torchrun's
N interpreters on a small machine); each rank joins a gloo group through a FileStore, runs a few collectives on
the default group and on a second group, then:

* ``stall``: BAD_RANK never calls the next all_reduce (as if stuck in data loading); the others time out in it;
* ``desync``: BAD_RANK calls a broadcast where the others call the all_reduce;
* ``size``: BAD_RANK calls the all_reduce with a tensor of another size;
* ``dead``: BAD_RANK exits before the all_reduce and leaves no dump;
* ``ok``: nobody misbehaves.

``torchrun --nproc-per-node N make_hang.py --torchrun OUTDIR SCENARIO FORMAT BAD_RANK`` runs one scenario the way a
job does (torchrun's rendezvous, its ``--log-dir`` for the ranks' output).

Every rank that is alive dumps its recorder the way ProcessGroupNCCL does on a timeout: ``_dump_fr_trace`` (pickle)
or ``_dump_fr_trace_json`` to ``OUTDIR/nccl_trace_rank_<rank>`` (``.json`` added for JSON), and writes its
stderr (with the traceback of the timeout) to ``OUTDIR/rank<rank>.log``. Needs ``TORCH_FR_BUFFER_SIZE`` set.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

WAIT = datetime.timedelta(seconds=3)  # how long the ranks wait in the collective that hangs
WAIT_OK = datetime.timedelta(seconds=60)  # nothing hangs: a slow (descheduled) rank must not time out


def train_step(x: torch.Tensor, group) -> None:
    dist.all_reduce(x)
    dist.all_reduce(x[:4], group=group)


def hang_point(scenario: str, rank: int, bad: int) -> None:
    if rank == bad and scenario == "desync":
        work = dist.broadcast(torch.ones(64), src=0, async_op=True)
    elif rank == bad and scenario == "size":
        work = dist.all_reduce(torch.ones(96), async_op=True)  # gloo aborts a rank sent more than it expects
    else:
        work = dist.all_reduce(torch.ones(64), async_op=True)
    work.wait(WAIT_OK if scenario == "ok" else WAIT)


def dump(out: str, rank: int, fmt: str) -> None:
    c10d = torch._C._distributed_c10d
    if fmt == "json":
        data = c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False)
        data = data if isinstance(data, bytes) else data.encode()
        name = f"nccl_trace_rank_{rank}.json"
    else:
        data = c10d._dump_fr_trace(includeCollectives=True, includeStackTraces=True, onlyActive=False)
        name = f"nccl_trace_rank_{rank}"
    tmp = os.path.join(out, f".{name}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, os.path.join(out, name))


def rank_main(scenario: str, rank: int, world: int, out: str, fmt: str, bad: int, torchrun: bool = False) -> int:
    if torchrun:  # torchrun's rendezvous store; its --log-dir / --redirects keep each rank's output
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    else:
        log = os.open(os.path.join(out, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 2)
        os.dup2(log, 1)
        store = dist.FileStore(os.path.join(out, ".store"), world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
    group = dist.new_group(list(range(world)))
    x = torch.ones(64)
    for _ in range(3):
        train_step(x, group)
    if rank == bad and scenario == "dead":
        print(f"rank {rank}: exiting before the collective (simulated crash)", flush=True)
        os._exit(1)
    if rank == bad and scenario == "stall":
        others = [os.path.join(out, f"nccl_trace_rank_{r}" + (".json" if fmt == "json" else ""))
                  for r in range(world) if r != rank]
        deadline = time.monotonic() + 60
        while not all(os.path.exists(p) for p in others) and time.monotonic() < deadline:
            time.sleep(0.05)  # stuck elsewhere while the others wait in the collective
        dump(out, rank, fmt)
        return 0
    try:
        hang_point(scenario, rank, bad)
    except Exception:  # noqa: BLE001 - the timeout the job's log shows
        dump(out, rank, fmt)
        traceback.print_exc()
        sys.stderr.flush()
        if torchrun:
            time.sleep(1.5)  # torchrun stops every rank once one fails: let the stalled one dump first, as NCCL's do
        return 1
    dump(out, rank, fmt)
    if scenario == "ok":
        dist.barrier()
    return 0


def main() -> int:
    if sys.argv[1] == "--torchrun":  # one rank under torchrun: --torchrun OUTDIR SCENARIO FORMAT BAD_RANK
        out, scenario, fmt, bad = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
        return rank_main(scenario, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), out, fmt, bad, True)
    root = sys.argv[1]
    runs = []
    for spec in sys.argv[2:]:
        name, _, args = spec.partition("=")
        scenario, world, fmt, bad = args.split(",")
        out = os.path.join(root, name)
        os.makedirs(out, exist_ok=True)
        runs.append((scenario, int(world), out, fmt, int(bad)))
    # The recorder symbolises the stacks on the first pickle dump of a process (about a second of CPU); doing it
    # once here, before the fork, lets every rank inherit the warm symbol cache. The dumps' content is unchanged.
    from torch.utils._traceback import CapturedTraceback

    CapturedTraceback.format_all([CapturedTraceback.extract(cpp=False)])
    pids = {}
    for scenario, world, out, fmt, bad in runs:
        for rank in range(world):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = rank_main(scenario, rank, world, out, fmt, bad)
                finally:
                    os._exit(code)
            pids[pid] = rank
    deadline = time.monotonic() + 120
    while pids and time.monotonic() < deadline:
        pid, _status = os.waitpid(-1, os.WNOHANG)
        if pid:
            pids.pop(pid, None)
        else:
            time.sleep(0.05)
    for pid in pids:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    return 0 if not pids else 1


if __name__ == "__main__":
    sys.exit(main())
