"""LogIndex and RankFacet: the line index the log view draws from, built in a background thread."""

from __future__ import annotations

import threading
import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.present.tui.logindex import LogIndex
from diagnose.present.tui.rankfacet import RankFacet, rank_of_line


def expected_lines(data: bytes) -> list[bytes]:
    """What a text editor shows: split on \\n, no empty line after a final newline, \\r\\n endings dropped."""
    if not data:
        return []
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


def build(tmp_path: Path, data: bytes, chunk: int = 1 << 20) -> LogIndex:
    path = tmp_path / "x.log"
    path.write_bytes(data)
    return LogIndex(str(path), chunk_bytes=chunk).build_now()


@settings(max_examples=150, deadline=None)
@given(
    data=st.lists(st.sampled_from([b"a", b"bc", b"\n", b"\r\n", b"\xff", b" ", b"[rank1]: "]), max_size=60).map(
        b"".join
    ),
    chunk=st.integers(min_value=1, max_value=16),
)
def test_lines_match_a_plain_split_for_any_chunking(tmp_path_factory, data: bytes, chunk: int) -> None:
    index = build(tmp_path_factory.mktemp("ix"), data, chunk)
    if index.error:  # ingest refuses what it sniffs as binary (issue 19 #2): the view says so, as analyze does
        assert "binary data" in index.error and index.line_count == 0
        index.close()
        return
    want = expected_lines(data)
    assert index.line_count == len(want)
    assert [index.line_bytes(i) for i in range(index.line_count)] == want
    index.close()


def test_line_text_decodes_bad_bytes_and_caps_width(tmp_path: Path) -> None:
    index = build(tmp_path, b"ok \xff\xfe\n" + b"x" * 10_000 + b"\nlast")
    assert index.line_text(0) == "ok \\xff\\xfe"
    assert len(index.line_text(1, cap=100)) == 100
    assert index.line_text(2) == "last"
    assert index.longest_line == 10_000
    assert index.line_text(99) == ""


def test_empty_file_has_no_lines(tmp_path: Path) -> None:
    index = build(tmp_path, b"")
    assert index.line_count == 0 and index.done.is_set() and index.progress == 1.0
    assert index.search("x", 0) is None


def test_search_forward_backward_and_smart_case(tmp_path: Path) -> None:
    lines = [b"alpha", b"Error one", b"beta", b"error two", b"gamma", b"ERROR three"]
    index = build(tmp_path, b"\n".join(lines) + b"\n", chunk=7)
    assert index.search("error", 0) == 1  # lower case: case-insensitive
    assert index.search("error", 1) == 3
    assert index.search("error", 3) == 5
    assert index.search("error", 5) is None
    assert index.search("Error", 1) is None  # an upper-case letter: exact case
    assert index.search("error", 5, backward=True) == 3
    assert index.search("error", 1, backward=True) is None
    assert index.search("ERROR", 5, backward=True) is None
    assert index.search("ERROR", 6, backward=True) == 5


def test_backward_search_crosses_windows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import diagnose.present.tui.logindex as logindex

    monkeypatch.setattr(logindex, "SEARCH_WINDOW", 16)
    lines = [b"needle here"] + [b"filler line %d" % i for i in range(50)]
    index = build(tmp_path, b"\n".join(lines))
    assert index.search("needle", 50, backward=True) == 0
    assert index.search("line 49", 0) == 50  # forward, window by window
    assert index.search("needle", 0) is None
    assert index.search("line 3", 50, backward=True) == 40  # "filler line 39" (line 40) is the last before 50


def test_index_builds_in_the_background_and_readers_see_partial_lines(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    path.write_bytes(b"".join(b"line %06d\n" % i for i in range(5000)))  # 12 bytes a line
    gate = threading.Event()
    index = LogIndex(str(path), chunk_bytes=1200, gate=gate).start()
    try:
        assert not index.done.wait(0.2)  # held at the gate: start() returned without indexing
        assert index.line_count == 0
        gate.set()
        assert index.done.wait(10)
        assert index.line_count == 5000
        assert index.line_text(4999) == "line 004999"
    finally:
        index.close()


def test_paused_index_waits_and_resumes(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    path.write_bytes(b"".join(b"line %06d\n" % i for i in range(5000)))
    index = LogIndex(str(path), chunk_bytes=1200)
    index.pause()
    index.start()
    try:
        assert not index.done.wait(0.2) and index.line_count == 0 and index.paused
        index.resume()
        assert index.done.wait(10) and index.line_count == 5000 and not index.paused
    finally:
        index.close()


def test_partial_index_is_usable(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    path.write_bytes(b"".join(b"line %06d\n" % i for i in range(1000)))
    published = threading.Event()
    release = threading.Event()

    def on_progress(ix: LogIndex) -> None:
        if ix.line_count and not published.is_set():
            published.set()
            release.wait(10)

    index = LogIndex(str(path), chunk_bytes=120, on_progress=on_progress).start()
    try:
        assert published.wait(10)
        assert 0 < index.line_count < 1000 and not index.done.is_set()
        assert index.line_text(0) == "line 000000"
        assert index.search("line 000005", 0) == 5
        assert index.search("line 000900", 0) is None  # not indexed yet
        release.set()
        assert index.done.wait(10)
        assert index.search("line 000900", 0) == 900
    finally:
        release.set()
        index.close()


@pytest.mark.parametrize(
    "line, rank",
    [
        ("[rank3]: Traceback (most recent call last):", 3),
        ("[default1]:[rank9]: x", 9),
        ("[default2]: only a local rank", 2),
        ("12: srun label", 12),
        ("plain text", None),
        ("[bold]x[/]", None),
    ],
)
def test_rank_of_line_uses_normalize_line(line: str, rank: int | None) -> None:
    assert rank_of_line(line) == rank


def test_rank_facet_lists_one_ranks_lines(tmp_path: Path) -> None:
    rows = []
    for i in range(300):
        rows.append(b"[rank%d]: step %d" % (i % 3, i))
        if i % 10 == 0:
            rows.append(b"no prefix %d" % i)
    path = tmp_path / "ranks.log"
    path.write_bytes(b"\n".join(rows) + b"\n")
    index = LogIndex(str(path), chunk_bytes=256).start()
    facet = RankFacet(index, 1).start()
    try:
        assert facet.done.wait(10)
        facet.publish()  # the view does this on its UI thread
        lines = [index.line_text(r) for r in facet.rows]
        assert len(lines) == 100
        assert all(line.startswith("[rank1]: ") for line in lines)
        assert lines[0] == "[rank1]: step 1" and lines[-1] == "[rank1]: step 298"
        assert facet.row_of_line(facet.rows[5]) == 5
    finally:
        index.close()


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz"])
def test_compressed_log_is_read_through_ingest_as_text_and_cleaned_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    import bz2
    import gzip
    import lzma
    import tempfile

    compress = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}[suffix]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where ingest inflates it
    path = tmp_path / f"job.log{suffix}"
    path.write_bytes(compress(b"".join(b"[rank0]: line %d\n" % i for i in range(100))))
    index = LogIndex(str(path)).start()
    assert index.done.wait(10) and index.error is None
    assert index.line_count == 100 and index.line_text(99) == "[rank0]: line 99"
    assert any(scratch.iterdir())  # inflated into a temporary file...
    index.close()
    assert not any(scratch.iterdir())  # ... removed on close


def test_unreadable_log_sets_a_one_line_error(tmp_path: Path) -> None:
    index = LogIndex(str(tmp_path / "missing.log")).start()
    assert index.done.wait(10)
    assert index.error and "\n" not in index.error and "missing.log" in index.error
    assert index.line_count == 0 and index.line_text(0) == ""
    index.close()
    bad = tmp_path / "bad.gz"
    bad.write_bytes(b"not gzip at all")
    index = LogIndex(str(bad)).start()
    assert index.done.wait(10) and index.error and "\n" not in index.error
    index.close()


def test_rank_facet_scans_from_the_users_place_then_above(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Started at line 2500 of 5000, the facet reads from 500 (LEAD_LINES above) to the end first: the user's place
    is covered while the top is not; rows published later above the split come back in order, and ``publish``
    says how many went above."""
    from diagnose.present.tui import rankfacet

    monkeypatch.setattr(rankfacet, "BATCH_LINES", 100)
    path = tmp_path / "ranks.log"
    path.write_bytes(b"".join(b"[rank%d]: step %d\n" % (i % 4, i) for i in range(5000)))
    index = LogIndex(str(path)).build_now()
    gate = threading.Event()
    real_batch = RankFacet._scan_batch

    def gated(self, start, limit, above):  # the lines above the split wait until the test has looked
        if above:
            gate.wait(10)
        return real_batch(self, start, limit, above)

    monkeypatch.setattr(RankFacet, "_scan_batch", gated)
    facet = RankFacet(index, 2, around=2500).start()
    try:
        assert facet.split == 500
        deadline = time.monotonic() + 10
        while facet.tail_scanned < 5000 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert facet.covers(2500) and not facet.covers(10) and not facet.done.is_set()
        assert facet.publish() == 0 and list(facet.rows) == list(range(502, 5000, 4))
        gate.set()
        assert facet.done.wait(10)
        above = facet.publish()
        assert above == len(range(2, 500, 4))
        assert list(facet.rows) == list(range(2, 5000, 4))
        assert facet.row_of_line(2502) == list(facet.rows).index(2502)
    finally:
        index.close()


LINE_PARTS = st.sampled_from(["[rank3]: ", "[rank12]: ", "[rank003]: ", "[default2]:", "[rank1]:", " 3: ", "3: ",
                              "[host-1:7]: ", "[rank: 5] ", "node017: ", "(Worker pid=12) ", "\r", "\x1b[31m",
                              "[E1129 15:25:31.123 f.cpp:683] ", "2024-07-25T06:36:18Z ", "  ", "x", "/opt/a.py",
                              "Traceback", "é", "\x9b", "[2024-07-25 06:36:18,293] ", "[0,3]<stdout>: ", "  ",
                              "E1129 15:24:33.203000 421 f.py:986] ", "[NeMo I 2024-07-25 06:36:18 f:12] ",
                              "[E ProcessGroupNCCL.cpp:475] ", "warnings.warn(", "  5: ", "(", "[", "9"])


@settings(max_examples=600, deadline=None)
@given(st.lists(LINE_PARTS, max_size=6))
def test_rank_of_bytes_agrees_with_normalize(parts: list[str]) -> None:
    """The fast path on ``[rankN]: `` lines gives normalize's answer, whatever follows the prefix."""
    from diagnose.normalize import decode
    from diagnose.present.tui.rankfacet import rank_of_bytes

    raw = "".join(parts).encode("utf-8")
    assert rank_of_bytes(raw) == rank_of_line(decode(raw))


def _wait_for(condition, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


def test_following_indexes_lines_appended_to_the_file(tmp_path: Path) -> None:
    path = tmp_path / "live.log"
    path.write_bytes(b"one\ntwo\nthree without newline")
    index = LogIndex(str(path)).start()
    try:
        assert index.done.wait(10) and index.line_count == 3
        assert index.start_following(poll_s=0.01) is None
        with path.open("ab") as fh:
            fh.write(b" yet\nfour\nfive, half")
        assert _wait_for(lambda: index.line_count == 5)
        assert [index.line_text(i) for i in range(5)] == ["one", "two", "three without newline yet", "four",
                                                          "five, half"]
        with path.open("ab") as fh:
            fh.write(b" done\n" + b"".join(b"line %d\n" % i for i in range(1000)))
        assert _wait_for(lambda: index.line_count == 1005)
        assert index.line_text(4) == "five, half done" and index.line_text(1004) == "line 999"
        assert index.search("line 500", 0) == 505
        path.write_bytes(b"rotated\n")  # shrank: read again from its start and followed on (tail -f)
        assert _wait_for(lambda: index.truncations == 1 and index.line_count == 1)
        assert index.following and index.line_text(0) == "rotated"
        with path.open("ab") as fh:
            fh.write(b"after\n")
        assert _wait_for(lambda: index.line_count == 2) and index.line_text(1) == "after"
    finally:
        index.close()


def test_a_compressed_log_is_not_followed(tmp_path: Path) -> None:
    import gzip

    path = tmp_path / "job.log.gz"
    path.write_bytes(gzip.compress(b"a\nb\n"))
    index = LogIndex(str(path)).start()
    try:
        assert index.done.wait(10)
        assert "compressed" in (index.start_following() or "")
        assert not index.following
    finally:
        index.close()


@pytest.mark.parametrize("line", [b"[rank1]: " * n + b"[rank5]: x" for n in range(5, 10)]
                         + [b"[rank4]: [rank0]:   File \"a.py\"", b"[rank4]: [rank0]:[W1129 15:25:13.7 f.cpp:1] x",
                            b"[rank4]: [rank0]:  [rank2]: x"])
def test_rank_of_bytes_on_nested_torch_prefixes(line: bytes) -> None:
    from diagnose.normalize import decode
    from diagnose.present.tui.rankfacet import rank_of_bytes

    assert rank_of_bytes(line) == rank_of_line(decode(line))


def test_a_followed_file_that_is_deleted_is_said_gone_until_it_comes_back(tmp_path: Path) -> None:
    """qa-report-21 L5: ``rm job.log`` under ``tui --follow`` said nothing; the status kept "following"."""
    path = tmp_path / "live.log"
    path.write_bytes(b"one\ntwo\n")
    index = LogIndex(str(path)).start()
    try:
        assert index.done.wait(10) and index.start_following(poll_s=0.01) is None
        assert not index.gone
        path.unlink()
        assert _wait_for(lambda: index.gone) and index.following
        path.write_bytes(b"new run\n")
        assert _wait_for(lambda: not index.gone and index.line_text(0) == "new run")
        other = tmp_path / "rotated.log"
        other.write_bytes(b"run 3!\n\n")  # the same size, moved over the name: another file, read from its start
        os.replace(other, path)
        assert _wait_for(lambda: index.line_text(0) == "run 3!")
    finally:
        index.close()
