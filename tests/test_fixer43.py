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
