"""The -v MEMORY section and the markdown memory details: words and GiB from the typed ``MemoryAnalysis``, never
the JSON's internal keys or raw byte counts (issue 17)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import render_to_string

from diagnose.memory_types import Breakdown, MemoryAnalysis, MemoryOption, MemoryPrediction, PhasePeaks
from diagnose.model import Override, Report
from diagnose.present.markdown import render_markdown
from diagnose.present.memory_text import memory_lines

GIB = 1 << 30
SAMPLES = Path(__file__).resolve().parent.parent / "sample_logs"
INTERNAL = ("dp_known", "phase_peaks", "_bytes", "components", "request_is", "params_source", "null", "usable_bytes")


def _analysis(**current_given) -> MemoryAnalysis:
    fields = dict(strategy="distributed_optimizer", dp=1, dp_known=False, gpus=1, grad_dtype="fp32",
                  bytes_per_param=18.0, model_state_bytes=600 * GIB, transient_bytes=0,
                  components=Breakdown(params=70 * GIB, grads=140 * GIB, main_params=140 * GIB, optimizer=250 * GIB),
                  activation_bytes=None, phase_peaks=PhasePeaks(280 * GIB, 210 * GIB, 600 * GIB, 600 * GIB, 740 * GIB),
                  peak_bytes=600 * GIB, usable_bytes=134 * GIB)
    option = MemoryOption([Override("ddp.use_megatron_fsdp", True)], label="fsdp on 8 GPUs", cost="8 GPUs",
                          strategy="fsdp:optim_grads_params", gpus=8, dp=8, tp=1, pp=1, cp=1,
                          model_state_bytes=76 * GIB, transient_bytes=17 * GIB, activation_bytes=None,
                          peak_bytes=93 * GIB, fits=True, valid=True)
    return MemoryAnalysis(140 * GIB, 135 * GIB, "capacity", 36_000_000_000, "log", "dp_wrap",
                          current=MemoryPrediction(**{**fields, **current_given}), options=[option],
                          notes=["a note <b>"], explanation="The fp32 grad buffer did not fit.",
                          request_is="the fp32 grad buffer")


def test_memory_lines_say_it_in_words_and_gib():
    text = "\n".join(line for line, _ in memory_lines(_analysis()))
    assert "Verdict: the model state alone cannot fit on this GPU." in text
    assert "GPU of 140.00 GiB (134.00 GiB usable by the model)" in text
    assert "the failing request: 135.00 GiB (the fp32 grad buffer) at DP wrap time" in text
    assert "data-parallel size 1, not stated by the log" in text
    # the peak is the highest of wrap / first step / training; the checkpoint save is named apart
    assert "(peak 600.00 GiB); 740.00 GiB while saving a checkpoint" in text
    assert "1. fsdp on 8 GPUs: fits, predicted peak 93.00 GiB." in text
    assert "change: ddp.use_megatron_fsdp=true" in text
    assert not any(word in text for word in INTERNAL), text
    assert str(140 * GIB) not in text  # no raw byte counts


def test_the_change_line_is_a_command_and_never_wrapped():
    pairs = memory_lines(_analysis())
    assert [line for line, command in pairs if command] == ["     change: ddp.use_megatron_fsdp=true"]
    out = render_to_string(Report(memory=_analysis()), width=40, detail="verbose")
    assert "  change: ddp.use_megatron_fsdp=true" in out


def test_a_state_the_job_cannot_have_had_is_not_drawn():
    text = "\n".join(line for line, _ in memory_lines(_analysis(sized=False)))
    assert "Not sized" in text and "Model state per GPU" not in text


@pytest.mark.parametrize("render", [lambda r: render_to_string(r, width=100, detail="verbose"), render_markdown])
def test_text_and_markdown_show_the_section_from_the_typed_object(render):
    out = render(Report(memory=_analysis()))
    assert "The fp32 grad buffer did not fit." in out and "Options, cheapest first:" in out
    assert "dp_known" not in out and "phase_peaks" not in out
    assert "a note <b>" in out  # a note is shown as typed, never read as markup


def test_a_sample_oom_report_keeps_its_json_and_shows_words():
    from diagnose.pipeline import analyze

    report = analyze([str(SAMPLES / "ddp_wrap_oom.log")])
    assert report.memory is not None and report.memory.verdict == "capacity"
    data = report.to_dict()["memory"]
    assert data["current"]["dp_known"] is False and "phase_peaks" in data["current"]  # JSON unchanged
    out = render_to_string(report, width=120, detail="verbose")
    section = out.split("\nMEMORY\n", 1)[1]
    assert "Verdict: the model state alone cannot fit" in section and "dp_known" not in section
