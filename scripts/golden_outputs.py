"""Golden outputs for refactors that must not change what users get (issue 17): analyze (json, markdown, text -v)
for every sample log and check (json, text) for every test config in several variants, one file per run.
Usage, from the repository root: PYTHONPATH=. python3 scripts/golden_outputs.py OUTDIR; then diff -r two OUTDIRs
(object addresses in one sample's replay JSON vary between runs: mask 0x[0-9a-f]+ before comparing)."""
import contextlib
import glob
import io
import os
import sys

os.environ["DIAGNOSE_SKIP_SLURM"] = "1"
os.environ["COLUMNS"] = "200"
os.environ["NO_COLOR"] = "1"
os.environ.setdefault("DIAGNOSE_EXACT_PARAMS", "0")
from diagnose.present.cli import main

out = sys.argv[1]
os.makedirs(out, exist_ok=True)

def run(name, argv):
    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    with open(os.path.join(out, name), "w") as fh:
        fh.write(f"rc={code}\n{buf.getvalue()}\n--stderr--\n{err.getvalue()}")

logs = sorted(glob.glob("sample_logs/**/*.log", recursive=True))
for log in logs:
    base = log.replace("/", "__")
    run(base + ".json", ["analyze", log, "--format", "json", "--no-progress"])
    run(base + ".md", ["analyze", log, "--format", "markdown", "--no-progress"])
    run(base + ".txt", ["analyze", log, "-v", "--no-progress"])
configs = sorted(glob.glob("tests/data/configs/*")) + ["examples/run_config.yaml", "examples/mlm_args.txt"]
variants = [["--gpus", "8"], ["--gpus", "8", "--gpu", "h100-80gb"], ["--gpus", "32", "--gpu", "h200"],
            ["--gpus", "6", "--set", "model.tensor_model_parallel_size=4"],
            ["--gpus", "8", "--set", "model.fp8=hybrid", "--set", "model.use_te_rng_tracker=true",
             "--set", "model.cuda_graph_impl=transformer_engine"],
            ["--gpus", "8", "--set", "ddp.use_megatron_fsdp=true", "--set", "checkpoint.save=/c"],
            ["--gpus", "8", "--gpu-memory", "40GiB"]]
for cfg in configs:
    for i, v in enumerate(variants):
        base = f"check__{cfg.replace('/', '__')}__{i}"
        run(base + ".json", ["check", cfg, *v, "--format", "json"])
        run(base + ".txt", ["check", cfg, *v])
print(len(logs), "logs", len(configs), "configs")
