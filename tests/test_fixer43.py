"""fixer43: Ray's actor tag read as a process, not a host; qa-report-13 L2 (MEMORY "Now" before the model exists)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_logs"


def test_a_ray_actor_tag_names_a_process_and_its_ip_the_host():
    """Ray's "(ActorName pid=N)" / "(ActorName pid=N, ip=A)": the pid is the process (the stream), the ip, when there,
    the host; the actor's name is its class and never a host."""
    from diagnose.normalize import normalize_line

    bare = normalize_line("(EmbodiedFSDPActor pid=18343) ValueError: x")
    assert (bare.text, bare.host, bare.pid, bare.rank) == ("ValueError: x", None, 18343, None)
    with_ip = normalize_line("(RayWorkerWrapper pid=5528, ip=10.0.3.17) y")
    assert (with_ip.host, with_ip.pid) == ("10.0.3.17", 5528)
    assert normalize_line("(VllmWorker TP0 pid=40622) z").host is None
    # two actors of one class are two processes (two streams); one actor's lines are one
    other = normalize_line("(EmbodiedFSDPActor pid=18342) ValueError: x")
    again = normalize_line('(EmbodiedFSDPActor pid=18343)   File "/w/a.py", line 3, in f')
    assert bare.stream != other.stream and bare.stream == again.stream
    assert bare.stream != normalize_line("ValueError: x").stream  # the driver's own lines
    # a rank tag after the actor's tag is still peeled (it was, when the actor's name stood for a host)
    assert normalize_line("(Worker pid=3) [2] RuntimeError: boom").rank == 2


def test_the_report_names_no_actor_class_as_a_host():
    from diagnose.pipeline import AnalyzeOptions, analyze

    log = ROOT / "corpus" / "dev" / "cx-rlinf-fsdp-resume-dcp-size-mismatch-flat-param.log"
    report = analyze([str(log)], AnalyzeOptions(replay=False))
    assert report.root is not None and report.root.rule == "CK021"
    assert all(f.hosts == [] for f in report.findings)


def _b042_and_wrap():
    from diagnose.pipeline import analyze

    return analyze([str(SAMPLES / "b042_first_iter_oom.log")]), analyze([str(SAMPLES / "ddp_wrap_oom.log")])


def test_memory_now_before_the_model_build_claims_no_resident_state():
    """qa-report-13 L2: b042's OOM is in the JIT warm-up at set-up (phase init), before the model is built; the
    112 GiB in use were warm-up tensors. "Now" says what the log says (the allocation that failed, what was in use),
    and the model's state is the prediction once it is built, labelled so, in the -v text and the TUI."""
    from diagnose.present.memory_text import memory_lines
    from diagnose.present.tui.memoryview import memory_text

    b042, wrap = _b042_and_wrap()
    assert b042.memory is not None and b042.memory.phase == "init" and not b042.memory.model_built
    lines = [line for line, _ in memory_lines(b042.memory, b042.root)]
    now = next(line for line in lines if line.startswith("Now"))
    assert "before the model was built" in now and "none of the model's state" in now
    assert "56.00 GiB" in now and "113.14 GiB" in now and "112.00 GiB allocated by PyTorch" in now
    assert not any(line.startswith("As configured") for line in lines)
    assert any(line.startswith("Predicted once the model is built, as configured") for line in lines)
    assert "not built yet" in b042.memory.explanation and "predicted 27.52 GiB" in b042.memory.explanation

    tui = memory_text(b042.memory, b042.root).plain
    now_part, predicted = tui.split("Predicted once built:", 1)
    now_part = now_part.split("Now:", 1)[1]
    assert "before the model was built" in now_part and "113.14 GiB" in now_part
    assert not any(name in now_part for name in ("params", "grads", "optimizer"))
    assert "optimizer" in predicted and "27.52 GiB" in predicted

    # a model that was built (DP wrap) keeps its "Now" bars and "As configured"
    assert wrap.memory is not None and wrap.memory.model_built
    assert any(line.startswith("As configured") for line, _ in memory_lines(wrap.memory, wrap.root))
    wrap_tui = memory_text(wrap.memory, wrap.root).plain
    assert "Predicted once built" not in wrap_tui and "\n  optimizer" in wrap_tui.split("Now:", 1)[1]
