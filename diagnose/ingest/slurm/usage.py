"""What a job used, as ``seff`` reports it, from sacct's fields: nodes, GPUs, MaxRSS, CPU efficiency, and the
GPU-hours a failed job spent (GPUs x elapsed: what the failure cost).

sacct gives MaxRSS per step (the job line is empty; jobacct_gather samples it every JobAcctGatherFrequency, so a
step shorter than that has none), TotalCPU on the job line (the sum of its steps), the GPUs in AllocTRES
(``gres/gpu=8``, sometimes also typed ``gres/gpu:h100=8``), else in ReqTRES (a job that was never allocated). Anything
missing stays None: never a made-up zero. A TRES list that names no GPU is a job without GPUs: 0, not missing.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from diagnose.coerce import as_int
from diagnose.ingest.slurm.parse import parse_seconds

USAGE_FIELDS = ["NNodes", "AllocCPUS", "AllocTRES", "ReqTRES", "TotalCPU", "MaxRSS"]
TRES_FIELDS = ("AllocTRES", "ReqTRES")  # where a job's GPUs are read, in this order (gpus_from_fields)

_RSS = re.compile(r"(\d+(?:\.\d+)?)([KMGTP]?)", re.IGNORECASE)
_RSS_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


@dataclass(slots=True)
class Usage:
    nnodes: int | None = None
    gpus: int | None = None
    cpus: int | None = None
    total_cpu_s: float | None = None
    max_rss_bytes: int | None = None

    def gpu_hours(self, elapsed_s: int | None) -> float | None:
        """GPUs x elapsed, in hours: what the job held until it failed."""
        if self.gpus is None or elapsed_s is None:
            return None
        return self.gpus * elapsed_s / 3600

    def cpu_efficiency(self, elapsed_s: int | None) -> float | None:
        """seff's CPU efficiency: CPU time used / (allocated CPUs x elapsed), 0..1; None when a part is missing."""
        if self.total_cpu_s is None or not self.cpus or not elapsed_s:
            return None
        return min(1.0, self.total_cpu_s / (self.cpus * elapsed_s))


def parse_rss(text: str | None) -> int | None:
    """sacct's MaxRSS (``123456K``, ``1.50G``, ``0``) in bytes; None when empty."""
    m = _RSS.fullmatch((text or "").strip())
    if m is None:
        return None
    return int(float(m.group(1)) * _RSS_UNITS[m.group(2).upper()])


def gpus_from_tres(text: str | None) -> int | None:
    """``billing=8,cpu=8,gres/gpu=8,gres/gpu:h100=8,node=1`` -> 8 (the untyped count, else the typed ones summed);
    0 when the TRES list names no GPU; None when there is no TRES list."""
    if not (text or "").strip():
        return None
    plain, typed = None, 0
    for item in (text or "").split(","):
        name, _, value = item.partition("=")
        if not value.isdigit():
            continue
        if name == "gres/gpu":
            plain = int(value)
        elif name.startswith("gres/gpu:"):
            typed += int(value)
    return plain if plain is not None else typed


def gpus_from_fields(get: Callable[[str], str | None]) -> int | None:
    """A job's GPUs from its sacct fields (``get``: a field's value by name): AllocTRES's, else ReqTRES's; 0 when the
    list names no GPU (a CPU job); None when sacct gave neither list. The one reading for the job view, ``slurm
    --failed`` and the fleet, so that they count a job's GPUs alike (qa-report-15 L7)."""
    for name in TRES_FIELDS:
        gpus = gpus_from_tres(get(name))
        if gpus is not None:
            return gpus
    return None


def usage_from_rows(job_fields: dict[str, str], step_fields: list[dict[str, str]]) -> Usage:
    """The job's usage from its sacct line and its steps' lines (MaxRSS: the largest step's)."""
    rss = [r for r in (parse_rss(f.get("MaxRSS")) for f in [job_fields, *step_fields]) if r is not None]
    return Usage(
        nnodes=as_int(job_fields.get("NNodes"), negative=False),
        gpus=gpus_from_fields(job_fields.get),
        cpus=as_int(job_fields.get("AllocCPUS"), negative=False),
        total_cpu_s=parse_seconds(job_fields.get("TotalCPU")),
        max_rss_bytes=max(rss) if rss else None,
    )
