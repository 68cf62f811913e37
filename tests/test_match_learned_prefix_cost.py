"""The matcher learns a prefix from the log (diagnose.normalize.learned) only by reading the lines after a candidate
traceback header; a header that can teach nothing (quoted in a message, a shape refused already, a budget spent)
must read no line ahead, or a log that quotes a traceback on every line reads each of its lines several times."""

from __future__ import annotations

from diagnose.match import engine, load_catalogue, match_text

CATALOGUE = load_catalogue()


def _lines_read_ahead_by_learning(monkeypatch, text: str) -> int:
    read = 0
    learning = False
    learn_prefix, forwards = engine._LineReader.learn_prefix, engine._LineReader.forwards

    def counted_learn_prefix(self, *args):
        nonlocal learning
        learning = True
        try:
            return learn_prefix(self, *args)
        finally:
            learning = False

    def counted_forwards(self, *args, **kwargs):
        nonlocal read
        for item in forwards(self, *args, **kwargs):
            read += learning
            yield item

    monkeypatch.setattr(engine._LineReader, "learn_prefix", counted_learn_prefix)
    monkeypatch.setattr(engine._LineReader, "forwards", counted_forwards)
    match_text(text, CATALOGUE)
    return read


def test_a_quoted_traceback_header_reads_no_line_ahead(monkeypatch):
    text = "".join(f"step {i} warning: caught 'Traceback (most recent call last): ...' and retried\n"
                   f"step {i} loss 2.0\n" for i in range(300))
    assert _lines_read_ahead_by_learning(monkeypatch, text) == 0


def test_a_refused_prefix_shape_stops_reading_ahead(monkeypatch):
    # "step N note: " is a candidate, refused (no frame follows it) a few times, then never tried again
    text = "".join(f"step {i} note: Traceback (most recent call last): seen\nstep {i} loss 2.0\n" for i in range(300))
    assert _lines_read_ahead_by_learning(monkeypatch, text) < 100


def test_a_real_prefix_is_still_learned():
    text = ("[w3 out] Traceback (most recent call last):\n"
            '[w3 out]   File "/app/train.py", line 9, in <module>\n'
            "[w3 out]     open(path)\n"
            "[w3 out] FileNotFoundError: [Errno 2] No such file or directory: '/data/x'\n")
    report = match_text(text, CATALOGUE)
    assert [f.rule for f in report.findings][:1] == ["PY001"]
