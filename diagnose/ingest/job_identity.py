"""What a log says about the job that wrote it: the Slurm job id, torchrun's run id, the rendezvous master, the
world size. Read from the file name and a bounded sample of the text (its head, where launchers print their
banners, and its tail, where slurmstepd writes ``*** JOB 123 ON node CANCELLED ...``).

Two logs whose identities disagree on a key come from different jobs. Only the Slurm job id and a run id that is
not torchrun's default (``none``) also *join* logs: many jobs share a master address, port and world size, so
those keys only separate.
"""

from __future__ import annotations

import os
import re

HEAD_BYTES = 64 << 10
TAIL_BYTES = 16 << 10

JOINING_KEYS = ("slurm_job", "run_id")  # equal values: the same job
KEY_WORDS = {"slurm_job": "Slurm job", "run_id": "torchrun run id", "master": "master", "world_size": "world size"}

# slurm-<id>.out (sbatch's default, %j), slurm-<array>_<task>.out (%A_%a)
_SLURM_NAME = re.compile(r"(?:^|[^0-9A-Za-z])slurm-(\d+)(?:_(\d+))?(?:\.\d+)?\.(?:out|err|log)\b", re.IGNORECASE)
_CONTENT = {
    "slurm_job": [
        re.compile(rb"slurmstepd(?:-[\w.-]+)?: error: \*\*\* (?:JOB|STEP) (\d+)(?:[._](\d+))?\b"),
        re.compile(rb"\bsrun: job (\d+) (?:queued and waiting|has been allocated)"),
        re.compile(rb"\bSLURM_JOB_?ID=(\d+)\b"),
    ],
    "run_id": [re.compile(rb"^\s*run_id\s*:\s*([\w.:-]+)\s*$", re.MULTILINE),
               re.compile(rb"--rdzv[-_]id[= ]([\w.:-]+)")],
    "master": [re.compile(rb"\bMASTER_ADDR=([\w.-]+)[\s;,]+(?:export\s+)?MASTER_PORT=(\d+)"),
               re.compile(rb"^\s*rdzv_endpoint\s*:\s*([\w.-]+):(\d+)\s*$", re.MULTILINE)],
    "world_size": [re.compile(rb"^\s*world_size \.{3,} (\d+)\s*$", re.MULTILINE),
                   re.compile(rb"\bWORLD_SIZE=(\d+)\b")],
}
_NO_RUN_ID = {"none", "null", "default", ""}
# a literal every pattern of the key needs: most logs hold none of them, and bytes.find is much cheaper than a
# regex search (a folder of 4096 per-rank logs is sampled in well under a second)
_LITERALS = {"slurm_job": (b"slurmstepd", b"srun: job", b"SLURM_JOB"), "run_id": (b"run_id", b"rdzv"),
             "master": (b"MASTER_ADDR", b"rdzv_endpoint"), "world_size": (b"world_size", b"WORLD_SIZE")}


def identity_from_name(path: str) -> dict[str, str]:
    m = _SLURM_NAME.search(os.path.basename(path))
    if m is None:
        return {}
    return {"slurm_job": m.group(1) + (f"_{m.group(2)}" if m.group(2) else "")}


def identity_from_text(head: bytes, tail: bytes = b"") -> dict[str, str]:
    """The first value of each key found in the sample; a key whose sample holds two different values (a log that
    holds several runs, or a banner quoting another job) is left out: it cannot tell jobs apart."""
    out: dict[str, str] = {}
    for key, patterns in _CONTENT.items():
        lines = _lines_with(_LITERALS[key], (head, tail))
        values: set[str] = set()
        for pattern in patterns:
            for line in lines:
                for m in pattern.finditer(line):
                    parts = [g.decode("ascii", "replace") for g in m.groups() if g is not None]
                    value = ":".join(parts) if key == "master" else parts[0]
                    if key == "run_id" and value.lower() in _NO_RUN_ID:
                        continue
                    values.add(value)
        if len(values) == 1:
            out[key] = values.pop()
    return out


def _lines_with(literals: tuple[bytes, ...], samples: tuple[bytes, ...], limit: int = 64) -> list[bytes]:
    """The lines of the samples that hold one of the literals (at most ``limit`` per literal and sample)."""
    found: dict[bytes, None] = {}
    for sample in samples:
        for literal in literals:
            at = sample.find(literal)
            for _ in range(limit):
                if at < 0:
                    break
                start = sample.rfind(b"\n", 0, at) + 1
                end = sample.find(b"\n", at)
                end = len(sample) if end < 0 else end
                found.setdefault(sample[start:end])
                at = sample.find(literal, end)
    return list(found)


def identity_of(path: str, buffer) -> dict[str, str]:
    """A log's identity from its name and the head and tail of its (mapped or read) content."""
    size = len(buffer)
    head = bytes(buffer[:HEAD_BYTES])
    tail = bytes(buffer[max(HEAD_BYTES, size - TAIL_BYTES):]) if size > HEAD_BYTES else b""
    found = identity_from_text(head, tail)
    by_name = identity_from_name(path)
    if "slurm_job" in by_name:
        found.setdefault("slurm_job", by_name["slurm_job"])
    return found


def conflict(a: dict[str, str], b: dict[str, str]) -> str | None:
    """The first key on which two identities disagree, or None."""
    return next((key for key in KEY_WORDS if key in a and key in b and a[key] != b[key]), None)


def shares_a_join(a: dict[str, str], b: dict[str, str]) -> bool:
    return any(key in a and a.get(key) == b.get(key) for key in JOINING_KEYS)


def label(identity: dict[str, str]) -> str:
    """``Slurm job 117``, ``torchrun run id abc``, ``master node1:29500, world size 8``, or ""."""
    for key in JOINING_KEYS:
        if key in identity:
            return f"{KEY_WORDS[key]} {identity[key]}"
    return ", ".join(f"{KEY_WORDS[k]} {identity[k]}" for k in ("master", "world_size") if k in identity)
