"""The scan's line reader: a line cut by a look-ahead's byte limit is not remembered cut for a later look-back."""

from __future__ import annotations

from diagnose.match.engine import _LineReader


def test_a_line_cut_by_a_forward_byte_limit_reads_whole_when_read_back():
    frame = '  File "/usr/local/lib/python3.10/dist-packages/deepspeed/elasticity/elastic_agent.py", line 9, in <module>'
    text = f"first line\n{frame}\nImportError: cannot import name 'log'\n".encode()
    reader = _LineReader(text, "job.log")
    ahead = list(reader.forwards(0, 1, 5, 40))  # the frame's line runs past the 40 bytes looked at
    assert len(ahead) == 1 and ahead[0][1].text != frame.strip() and frame.strip().startswith(ahead[0][1].text.strip())
    last = text.index(b"ImportError")
    back = [line for _s, line in reader.backwards(last, 3, 5, 1 << 20)]
    assert back[0].text.strip() == frame.strip() and back[0].lineno == 2
