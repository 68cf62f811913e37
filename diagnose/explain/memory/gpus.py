"""GPU memory capacities, and sizes written the way people and PyTorch write them.

Capacities are what ``torch.cuda.get_device_properties(i).total_memory`` reports (the number PyTorch prints as
"total capacity" in an OOM message), not the marketing number: an H200 sold as 141 GB reports 139.80 GiB
(150,110,011,392 bytes, measured on the H200 behind ../shared/real_logs). Where no measured value is known we take
the board's memory in GiB minus the same ~0.85 % the driver keeps on an H200/H100.
"""

from __future__ import annotations

from dataclasses import dataclass

from diagnose.model import DiagnoseError
from diagnose.units import GIB, MIB, SIZE, fmt_gib, parse_size


@dataclass(frozen=True)
class GpuModel:
    name: str
    capacity_bytes: int  # as torch reports it
    note: str = ""


def _gib(x: float) -> int:
    return int(round(x * GIB))


GPUS: dict[str, GpuModel] = {
    g.name: g
    for g in (
        GpuModel("h200", 150_109_880_320, "141 GB HBM3e; torch reports 139.80 GiB (measured total_memory)"),
        GpuModel("h100-80gb", _gib(79.11), "80 GB HBM3 (SXM); torch reports 79.11 GiB"),
        GpuModel("h100-94gb", _gib(93.00), "H100 NVL 94 GB; torch reports ~93.0 GiB"),
        GpuModel("h100-pcie", _gib(79.11), "80 GB PCIe"),
        GpuModel("h20", _gib(95.00), "96 GB HBM3"),
        GpuModel("a100-40gb", _gib(39.39), "40 GB HBM2; torch reports 39.39 GiB"),
        GpuModel("a100-80gb", _gib(79.15), "80 GB HBM2e; torch reports 79.15 GiB"),
        GpuModel("b200", _gib(178.35), "180 GB HBM3e per GPU (HGX B200)"),
        GpuModel("gb200", _gib(184.31), "186 GB HBM3e per GPU (GB200 NVL72)"),
        GpuModel("b300", _gib(268.00), "270 GB HBM3e per GPU"),
        GpuModel("gb300", _gib(275.00), "279 GB HBM3e per GPU"),
        GpuModel("l40s", _gib(44.39), "48 GB GDDR6; torch reports 44.39 GiB"),
        GpuModel("l40", _gib(44.39), "48 GB GDDR6"),
        GpuModel("a10", _gib(22.07), "24 GB GDDR6"),
        GpuModel("v100-32gb", _gib(31.74), "32 GB HBM2"),
        GpuModel("mi300x", _gib(191.98), "192 GB HBM3 (ROCm)"),
    )
}
# Blackwell (compute capability 10.x): Megatron-LM's TP/CP > 1 requirement of CUDA_DEVICE_MAX_CONNECTIONS=1 is for
# older GPUs only (megatron/training/arguments.py, ``get_device_arch_version() < 10``)
BLACKWELL = frozenset({"b200", "gb200", "b300", "gb300"})

ALIASES = {
    "h200-141gb": "h200",
    "h100": "h100-80gb",
    "h100-sxm": "h100-80gb",
    "h100-nvl": "h100-94gb",
    "a100": "a100-80gb",
    "a100-40g": "a100-40gb",
    "a100-80g": "a100-80gb",
    "h100-80g": "h100-80gb",
}


def parse_gpu_memory(text: str) -> tuple[int, str | None]:
    """``--gpu-memory``: bytes and a note for the user (or None).

    A bare number under 1 MiB has no plausible meaning in bytes (``80`` meant 80 GiB): refused, with the spelling
    to use. A decimal size near a GPU's marketed one (``80GB`` = 74.51 GiB, while an "80 GB" H100 reports 79.11
    GiB to torch) is taken as written, with a note naming the ``--gpu`` that has the real capacity.
    """
    raw = str(text).strip()
    value = parse_size(raw)
    if value is None:
        raise DiagnoseError(f"--gpu-memory: not a memory size: {raw[:60]!r} (try e.g. 80GiB, 79.15GiB, 141GB)")
    if value <= 0:
        raise DiagnoseError(f"--gpu-memory {raw[:40]!r}: must be more than 0")
    m = SIZE.match(raw)
    unit = m.group(2).lower() if m else ""
    if unit in ("", "b", "bytes") and value < MIB:
        raise DiagnoseError(f"--gpu-memory {raw[:40]!r} has no unit (that is {value} bytes): write e.g. "
                            f"{raw[:20]}GiB, or name the GPU with --gpu (e.g. h100-80gb)")
    note = None
    if unit in ("gb", "tb"):
        near = [g for g in GPUS.values() if value <= g.capacity_bytes <= value * 1.10]
        if near:
            g = min(near, key=lambda g: g.capacity_bytes)
            note = (f"{raw} = {fmt_gib(value)} (GB is 10^9 bytes); a GPU sold as {raw} has "
                    f"{fmt_gib(g.capacity_bytes)}: --gpu {g.name}")
    return value, note


def gpu_by_name(name: str) -> GpuModel:
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    key = ALIASES.get(key, key)
    if key not in GPUS:
        raise DiagnoseError(f"unknown GPU {name[:40]!r}; known: {', '.join(sorted(GPUS))} (or use --gpu-memory 80GiB)")
    return GPUS[key]

