"""``fleet submit``: the scan as a Slurm array job, and ``fleet merge``: the shards folded into the store.

``write_array`` freezes the work at submit time, so every array task sees the same list: the log files go into
``manifest.txt`` (one absolute path a line), a Slurm window into fixed ``--start/--end`` times. Task ``I`` of ``N``
runs ``diagnose fleet scan ... --shard I/N --store shard-I.db`` (``I`` from ``SLURM_ARRAY_TASK_ID``): it takes every
N-th file of the manifest, or the Slurm jobs whose key's CRC32 is I modulo N, and writes its own store, so the
tasks never contend for one SQLite file (which may sit on a network file system where locking is unreliable).
``merge.sbatch`` (submitted with ``--dependency=afterany`` when asked) runs ``fleet merge``; it can also be run by
hand. Every value put into the scripts is shell-quoted.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass

import diagnose
from diagnose.fleet.scan import FileItem
from diagnose.fleet.store import FleetStore
from diagnose.ingest.slurm.commands import run_slurm
from diagnose.ingest.slurm.job import Runner
from diagnose.model import DiagnoseError

MAX_TASKS = 10_000
_SBATCH_ARG = re.compile(r"--?[A-Za-z][A-Za-z0-9-]*(=[^\s;&|`$<>]*)?")


@dataclass(slots=True)
class ArrayPlan:
    run_dir: str
    tasks: int
    array_script: str
    merge_script: str
    shard_paths: list[str]


def write_array(run_dir: str, store: str, tasks: int, files: list[FileItem] | None = None,
                window: tuple[str, str] | None = None, user: str | None = None, name: str | None = None,
                sbatch_args: list[str] | None = None,
                gpus_per_node: int = 8, python: str | None = None) -> ArrayPlan:
    """Write manifest, array and merge scripts into ``run_dir``; submit nothing."""
    if not 1 <= tasks <= MAX_TASKS:
        raise DiagnoseError(f"--tasks {tasks}: expected 1 to {MAX_TASKS}")
    for arg in sbatch_args or []:
        if not _SBATCH_ARG.fullmatch(arg):
            raise DiagnoseError(f"--sbatch-arg {arg[:40]!r}: expected one option like --partition=cpu")
    run_dir = os.path.abspath(run_dir)
    if re.search(r"[\s%'\"\\]", run_dir):  # #SBATCH lines are not shell-parsed: keep the folder name plain
        raise DiagnoseError(f"--run-dir {run_dir[:80]!r}: use a folder without spaces, quotes or %")
    os.makedirs(run_dir, exist_ok=True)
    store = os.path.abspath(store)
    q = shlex.quote
    if files is not None:
        manifest = os.path.join(run_dir, "manifest.txt")
        with open(manifest, "w", encoding="utf-8") as fh:
            for item in files:
                if "\n" in item.path:
                    raise DiagnoseError(f"a log path contains a newline: {item.path[:60]!r}")
                fh.write(item.path + "\n")
        source = f"--manifest {q(manifest)}"
    elif window is not None:
        source = f"--sacct --start {q(window[0])} --end {q(window[1])}" + (f" --user {q(user)}" if user else "")
        source += f" --name {q(name)}" if name else ""
    else:
        raise DiagnoseError("fleet submit: give log files/folders, or --sacct")
    python = python or sys.executable
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(diagnose.__file__)))
    environment = (f"set -euo pipefail\nexport PYTHONPATH={q(package_root)}${{PYTHONPATH:+:$PYTHONPATH}}\n"
                   f"exec {q(python)} -m diagnose fleet")
    shard = os.path.join(run_dir, "shard-")
    array_script = os.path.join(run_dir, "fleet-array.sbatch")
    _write_script(array_script, ["--job-name=diagnose-fleet", f"--array=0-{tasks - 1}",
                                 f"--output={run_dir}/shard-%a.out", *(sbatch_args or [])],
                  "# written by 'diagnose fleet submit': task I scans shard I of the work into its own store\n"
                  f"{environment} scan {source} --shard \"$SLURM_ARRAY_TASK_ID/{tasks}\" "
                  f"--store {q(shard)}\"$SLURM_ARRAY_TASK_ID.db\" --jobs \"${{SLURM_CPUS_PER_TASK:-1}}\" "
                  f"--gpus-per-node {int(gpus_per_node)} --no-progress\n")
    merge_script = os.path.join(run_dir, "fleet-merge.sbatch")
    shards = [f"{shard}{i}.db" for i in range(tasks)]
    _write_script(merge_script, ["--job-name=diagnose-fleet-merge", f"--output={run_dir}/merge.out",
                                 *(sbatch_args or [])],
                  f"{environment} merge --store {q(store)} --missing-ok {' '.join(q(s) for s in shards)}\n")
    return ArrayPlan(run_dir, tasks, array_script, merge_script, shards)


def _write_script(path: str, sbatch_options: list[str], body: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("#!/bin/bash\n" + "".join(f"#SBATCH {option}\n" for option in sbatch_options) + body)


def submit(plan: ArrayPlan, then_merge: bool, runner: Runner = run_slurm) -> tuple[str, str | None]:
    """sbatch the array (and the dependent merge); return their job ids."""

    def sbatch(what: str, *args: str) -> str:
        done = runner(["sbatch", "--parsable", "-D", plan.run_dir, *args])
        if not done.ok:
            raise done.failure(what)
        return done.stdout.strip().split(";")[0]

    array_id = sbatch("sbatch", plan.array_script)
    merge_id = sbatch("sbatch (merge)", f"--dependency=afterany:{array_id}", plan.merge_script) if then_merge else None
    return array_id, merge_id


@dataclass(slots=True)
class MergeResult:
    merged: list[tuple[str, int]]  # (shard, new jobs)
    missing: list[str]


def merge(store_path: str, shards: list[str], missing_ok: bool = False) -> MergeResult:
    """Fold each shard into the store, one transaction per shard (a killed merge keeps the shards it committed;
    rerunning it adds only what is missing)."""
    result = MergeResult([], [])
    with FleetStore(store_path) as store:
        for shard in shards:
            if not os.path.exists(shard):
                if not missing_ok:
                    raise DiagnoseError(f"shard {shard} does not exist")
                result.missing.append(shard)
                continue
            if os.path.samefile(shard, store_path):
                raise DiagnoseError(f"shard {shard} is the store itself")
            result.merged.append((shard, store.merge_from(shard)))
    return result
