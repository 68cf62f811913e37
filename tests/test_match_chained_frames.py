"""An exception that caused others is read with the frames of the exceptions it led to (where the work was done).

Python prints the first exception of a chain with the frames from where it was caught down to where it was raised
only (a socket's connect, say); the save that made the request is in the frames of the exception printed after
"During handling of the above exception". The ranking picks the first exception (the cause); its category and
phase must see the outer frames too, while its innermost frame stays where it was raised.
"""

from __future__ import annotations

from diagnose.match import load_catalogue, match_text
from diagnose.match.frames import caused_frames, traceback_frames
from diagnose.model import LogLine

CATALOGUE = load_catalogue()

_INNER = """\
Traceback (most recent call last):
  File "/env/lib/python3.10/site-packages/urllib3/connection.py", line 174, in _new_conn
    conn = connection.create_connection(
  File "/env/lib/python3.10/site-packages/urllib3/util/connection.py", line 85, in create_connection
    sock.connect(sa)
TimeoutError: timed out
"""
_OUTER = """\

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/env/lib/python3.10/site-packages/transformers/trainer.py", line 2336, in _save_checkpoint
    self.save_model(output_dir, _internal_call=True)
  File "/env/lib/python3.10/site-packages/peft/peft_model.py", line 216, in save_pretrained
    has_remote_config = file_exists(model_id, "config.json")
  File "/env/lib/python3.10/site-packages/requests/adapters.py", line 507, in send
    raise ConnectTimeout(e, request=request)
requests.exceptions.ConnectTimeout: (MaxRetryError("HTTPSConnectionPool(host='huggingface.co', port=443): Max retries exceeded with url: /m/resolve/main/config.json"), '(Request ID: 1)')
"""


def _lines(text: str) -> list[LogLine]:
    return [LogLine(path="x.log", lineno=i + 1, raw=t, text=t) for i, t in enumerate(text.splitlines())]


def test_the_cause_is_read_with_the_frames_of_the_exception_it_led_to():
    lines = _lines(_INNER + _OUTER)
    at = next(i for i, ll in enumerate(lines) if ll.text.startswith("TimeoutError"))
    own = [f.text for f in traceback_frames(lines[: at + 1])]
    assert own and all("urllib3" in t for t in own)  # where it was raised, and nothing above
    outer = [f.text for f in caused_frames(lines[: at + 1], lines[at + 1:])]
    assert any("_save_checkpoint" in t for t in outer) and any("save_pretrained" in t for t in outer)
    assert not any("urllib3" in t for t in outer)
    # the last exception of the chain caused nothing
    last = len(lines) - 1
    assert caused_frames(lines, []) == [] and caused_frames(lines[: last + 1], lines[last + 1:]) == []


def test_a_separate_traceback_after_it_lends_no_frames():
    separate = _OUTER.split("occurred:\n\n")[1]
    report = match_text(_INNER + "\nretrying the upload later\n" + separate, CATALOGUE)
    timeout = next(f for f in report.findings if f.evidence[0].text == "TimeoutError: timed out")
    assert timeout.category != "checkpoint_io"


def test_a_hub_timeout_that_broke_a_save_is_the_checkpoints_storage():
    report = match_text(_INNER + _OUTER, CATALOGUE)
    root = report.root
    assert root is not None and root.evidence[0].text == "TimeoutError: timed out"
    assert root.category == "checkpoint_io" and root.phase == "checkpoint_save"


def test_the_same_timeout_alone_says_nothing_of_a_checkpoint():
    report = match_text(_INNER, CATALOGUE)
    assert report.root is not None and report.root.category != "checkpoint_io"


def test_the_causes_own_frames_speak_first():
    # an API mismatch raised under a save stays the mismatch its own frames and words say, not the save's format
    inner = _INNER.replace("TimeoutError: timed out", "AttributeError: 'LoraModel' object has no attribute 'save_checkpoint'")
    inner = inner.replace("urllib3/connection.py", "peft/tuners/lora.py").replace("urllib3/util/connection.py",
                                                                                 "torch/nn/modules/module.py")
    alone = match_text(inner, CATALOGUE).root
    chained = match_text(inner + _OUTER, CATALOGUE).root
    assert alone is not None and chained is not None
    assert chained.evidence[0].text.startswith("AttributeError") and chained.category == alone.category
    assert chained.phase == "checkpoint_save"  # the phase is where the work was: the save
