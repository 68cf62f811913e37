"""Write every report the refactors of issue 17 must keep byte-identical, to compare before and after.

    python3 scripts/golden.py /tmp/golden_before      # on the commit before the change
    python3 scripts/golden.py /tmp/golden_after       # after it
    diff -r /tmp/golden_before /tmp/golden_after

Covers ``analyze`` (json, text, markdown) and ``verify`` (json) of every sample log, and ``check`` / ``replay``
(json and text) of every config the tests use (tests/data/configs, examples/). Runs in one process through
``cli.main`` with the cache off, so megatron-core answers cached by an earlier run cannot change the output. To
compare with an older commit: ``git archive <commit> | tar -x -C /tmp/base`` and run this script there.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = {"billion_laughs.yaml", "hostile_python_tag.yaml"}  # refused with one line: nothing to compare
CONFIGS = sorted(
    [p for p in (ROOT / "tests/data/configs").iterdir() if p.name not in HOSTILE] + list((ROOT / "examples").iterdir())
)


def _runs():
    for path in sorted((ROOT / "sample_logs").rglob("*.log")):
        log = path.relative_to(ROOT)  # relative: a checkout elsewhere (the commit before) prints the same paths
        name = str(log.relative_to("sample_logs")).replace("/", "__")
        for fmt, ext in (("json", "json"), ("text", "txt"), ("markdown", "md")):
            yield f"analyze/{name}.{ext}", ["analyze", str(log), "--format", fmt]
        yield f"verify/{name}.json", ["verify", str(log), "--format", "json"]
    for cfg in (c.relative_to(ROOT) for c in CONFIGS):
        for fmt, ext in (("json", "json"), ("text", "txt")):
            yield f"check/{cfg.name}.{ext}", ["check", str(cfg), "--gpus", "8", "--format", fmt]
            yield f"replay/{cfg.name}.{ext}", ["replay", str(cfg), "--format", fmt]
        yield f"replay/{cfg.name}.set.json", ["replay", str(cfg), "--set", "ddp.use_megatron_fsdp=true",
                                              "--format", "json"]


def main(out: Path) -> int:
    # no cache, and the analytic parameter count: megatron-core's exact count runs in a child and is used only when
    # it is ready in time, so on a loaded machine the same check could print either
    os.environ.update(DIAGNOSE_NO_CACHE="1", DIAGNOSE_SKIP_SLURM="1", DIAGNOSE_EXACT_PARAMS="0", COLUMNS="160",
                      NO_COLOR="1")
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    from diagnose.present.cli import main as cli

    for rel, argv in _runs():
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        code = cli([*argv, "-o", str(target)])
        target.with_name(target.name + ".rc").write_text(f"{code}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/golden")))
