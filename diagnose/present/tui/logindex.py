"""A line index over a memory-mapped log, built in a background thread, so a multi-GB log opens at once.

The index is one ``array('q')`` of line start offsets (8 bytes a line, not a list of Python ints). The builder
thread publishes lines as it goes: readers see ``line_count`` complete lines and can draw, search and jump within
them while the rest is still being indexed. No Textual import: the log view widget reads this.
"""

from __future__ import annotations

import bisect
import contextlib
import mmap
import os
import threading
import time
from array import array
from collections.abc import Callable
from itertools import accumulate

from diagnose.ingest import open_inputs
from diagnose.ingest.sources import release_pages
from diagnose.model import DiagnoseError

CHUNK_BYTES = 1 << 20
DEFAULT_LINE_CAP = 4096  # bytes of one line ever decoded for display
SEARCH_WINDOW = 4 << 20
YIELD_S = 0.001  # pause between chunks: the UI thread gets the GIL
FOLLOW_POLL_S = 0.25
_COMPRESSED_MAGIC = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd")  # gzip, bzip2, xz, zstd


def follow_refusal(path: str) -> str | None:
    """Why ``path`` cannot be followed (standard input, a folder, a compressed log), or None."""
    if path == "-" or not os.path.isfile(path):
        return f"{path}: only a plain log file can be followed"
    try:
        with open(path, "rb") as fh:
            magic = fh.read(6)
    except OSError as e:
        return f"cannot read {path}: {e.strerror or e}"
    if any(magic.startswith(m) for m in _COMPRESSED_MAGIC):
        return f"{path}: a compressed log does not grow; only a plain log file can be followed"
    return None


class _CutShorter(Exception):
    """The mapped file was cut shorter than the part about to be read."""


class LogIndex:
    """Offsets of every line of ``path``; ``start()`` builds them in a daemon thread.

    ``gate`` (optional) is waited on before each chunk: the tests hold it closed to prove the UI never waits for
    the index. ``on_progress`` is called from the builder thread after each chunk.
    """

    def __init__(self, path: str, chunk_bytes: int = CHUNK_BYTES, gate: threading.Event | None = None,
                 on_progress: Callable[[LogIndex], None] | None = None) -> None:
        self.path = path
        self._inputs = contextlib.ExitStack()  # ingest's open input (and temp file of a compressed one) until close()
        self.size = 0
        self._buf: mmap.mmap | bytes = b""
        self.opened = threading.Event()
        self._chunk = max(1, chunk_bytes)
        self._gate = gate
        self._on_progress = on_progress
        self._offsets = array("q", [0])
        self._count = 0  # complete lines published to readers
        self.indexed_bytes = 0
        self.longest_line = 0  # bytes, a lower bound while building (exact for lines inside one chunk)
        self.done = threading.Event()
        self.error: str | None = None
        self._closed = False
        self._thread: threading.Thread | None = None
        self.yield_s = YIELD_S
        self._running = threading.Event()  # cleared by pause(): the engine gets the CPU, the findings come first
        self._running.set()
        self.following = False  # start_following(): lines appended to the file are indexed as they come
        self.follow_note: str | None = None  # why following stopped
        self.truncations = 0  # times the file was cut shorter (its lines past the cut are dropped, it is read again)
        self.gone = False  # followed, and the path names no file now (deleted, or moved away by a rotation)
        self._follow_thread: threading.Thread | None = None
        # a descriptor of the mapped log when the map is of the user's file (not ingest's copy): its size is checked
        # before the map is read, so a file cut shorter is read again instead of a SIGBUS (qa-report-5 L1)
        self._watch: int | None = None
        self._remap = threading.RLock()  # one thread at a time changes the map and the offsets
        self._reloading = False

    # ------------------------------------------------------------------------------------------- build

    def start(self) -> LogIndex:
        if self._thread is None:
            self._thread = threading.Thread(target=self._build, name=f"log-index:{self.path}", daemon=True)
            self._thread.start()
        return self

    def pause(self) -> None:
        """Hold the builder between chunks (readers keep what is indexed) until ``resume()``."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def build_now(self) -> LogIndex:
        """Build in the calling thread (small inputs, tests)."""
        self._build()
        return self

    def _open(self) -> None:
        """Open the log the way analysis read it, through ingest (``.gz``/``.bz2``/``.xz`` inflated, bounded, into
        a temporary file; a large file memory-mapped): in the builder thread."""
        if self.path == "-":  # the TUI spools standard input to a file first; never read the terminal here
            raise DiagnoseError("-: standard input was read once and cannot be shown again")
        sources = self._inputs.enter_context(open_inputs([self.path]))
        if len(sources) != 1:
            raise DiagnoseError(f"{self.path}: not one log file")
        if self._closed:  # closed while ingest was opening it: nothing must outlive close()
            self._inputs.close()
            return
        self._buf = sources[0].buffer
        self.size = sources[0].size
        if isinstance(self._buf, mmap.mmap) and getattr(sources[0], "maps_input", False):
            with contextlib.suppress(OSError):
                self._watch = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self.opened.set()

    def _build(self) -> None:
        try:
            self._open()
            scan = 0
            while scan < self.size and not self._closed:
                if self._gate is not None:
                    self._gate.wait()
                self._running.wait()
                end = min(scan + self._chunk, self.size)
                with self._remap:
                    if self.truncations or not self._intact(end, reload_here=True):
                        return  # cut shorter: read again from its start (whole) by the reload
                    parts = self._buf[scan:end].split(b"\n")
                    if len(parts) > 1:
                        starts = accumulate((len(p) + 1 for p in parts[:-1]), initial=scan)
                        next(starts)  # the chunk start itself is not a new line
                        self._offsets.extend(starts)
                        self.longest_line = max(self.longest_line, max(len(p) for p in parts))
                    self._count = len(self._offsets) - 1
                    self._release(scan, end)
                scan = end
                self.indexed_bytes = scan
                if self._on_progress is not None:
                    self._on_progress(self)
                time.sleep(self.yield_s)  # hand the GIL to the UI (and the engine) between chunks
            if self._closed:
                return
            if self._offsets[-1] < self.size:  # last line has no newline: a sentinel one past its end
                self._offsets.append(self.size + 1)
                self.longest_line = max(self.longest_line, self.size - self._offsets[-2])
            self._count = len(self._offsets) - 1
            self.indexed_bytes = self.size
        except DiagnoseError as e:
            self.error = str(e)
        except OSError as e:
            self.error = f"cannot read {self.path}: {e.strerror or e}"
        except Exception as e:  # noqa: BLE001 - shown in the log view, never a crash of the UI
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self.opened.set()
            self.done.set()
            if self._on_progress is not None and not self._closed:
                self._on_progress(self)

    def _release(self, start: int, end: int) -> None:
        """Hand the pages of ``[start, end)`` back once indexed, searched or copied (as analysis does per window): a
        1.5 GB log otherwise stayed mapped in whole, 1.5 GB of resident memory for a screen of lines."""
        release_pages(self._buf, start, end)

    # ------------------------------------------------------------------------------------------- read

    @property
    def line_count(self) -> int:
        return self._count

    @property
    def progress(self) -> float:
        if not self.opened.is_set():
            return 0.0
        return 1.0 if self.size == 0 else self.indexed_bytes / self.size

    def line_bytes(self, index: int, cap: int = DEFAULT_LINE_CAP) -> bytes:
        """Line ``index`` (0-based) without its newline, at most ``cap`` bytes."""
        if not 0 <= index < self._count:
            return b""
        start = self._offsets[index]
        end = min(self._offsets[index + 1] - 1, start + cap)
        buf = self._buf
        if not self._intact(end):
            return b""
        data = buf[start:end]
        return data[:-1] if data.endswith(b"\r") else data

    def read_span(self, start: int, end: int) -> bytes:
        """Bytes ``start:end`` of the log (offsets from ``line_span``); empty once the file was cut shorter."""
        buf = self._buf
        if not self._intact(end):
            return b""
        data = buf[start:end]
        if end - start >= self._chunk:  # a rank filter's batch: copied, so its pages can go back (as in search)
            self._release(start, end)
        return data

    # ------------------------------------------------------------------------------- a file cut shorter

    def _intact(self, end: int, reload_here: bool = False) -> bool:
        """Whether the map may be read up to byte ``end``: a map of a file cut shorter has no pages past the cut,
        and touching one is SIGBUS, the TUI gone. One ``fstat`` (a microsecond) before each read of the map (a
        line drawn, a search window of 4 MiB, an index chunk of 1 MiB); a cut landing between the check and the
        read is still the supervisor's one line. Once cut, the file is read again from its start (as following
        does) in a thread, or here when ``reload_here`` (the builder's own thread)."""
        fd = self._watch
        if fd is None:
            return True
        try:
            size = os.fstat(fd).st_size
        except OSError:
            return True
        if size >= end:
            return True
        if size < self.size:  # not a reader's stale offset after the file was read again: cut (again) now
            self._count = 0  # readers see no line of the old map from now on
            if reload_here:
                self._reload()
            elif not self._reloading:
                self._reloading = True
                threading.Thread(target=self._reload, name=f"log-reload:{self.path}", daemon=True).start()
        return False

    def _reload(self) -> None:
        with self._remap:
            try:
                size = os.path.getsize(self.path)
                if not self._closed and size < self.size:  # not read again already (by another thread)
                    self._shrink_to(size)
                    self.truncations += 1
                    if not self.following:
                        self.follow_note = "the file was cut shorter while shown: read again from its start"
            except (OSError, ValueError) as e:
                self._count, self._buf, self.size = 0, b"", 0
                self.follow_note = f"the file was cut shorter while shown and cannot be read again: {e}"
                self.truncations += 1
            finally:
                self._reloading = False

    def line_text(self, index: int, cap: int = DEFAULT_LINE_CAP) -> str:
        return self.line_bytes(index, cap).decode("utf-8", errors="backslashreplace")

    def line_of_offset(self, offset: int) -> int:
        """0-based line holding byte ``offset`` (among published lines)."""
        return max(0, bisect.bisect_right(self._offsets, offset, 0, self._count) - 1)

    def line_span(self, index: int) -> tuple[int, int]:
        return self._offsets[index], self._offsets[index + 1]

    # ------------------------------------------------------------------------------------------ search

    def search(self, term: str, from_line: int, backward: bool = False) -> int | None:
        """Next (or previous) line after (before) ``from_line`` containing ``term``; None if none yet.

        Smart case: a term with an upper-case letter is matched exactly, else case-insensitively. Only the
        published lines are searched; the caller says "still indexing" when the index is not done.
        """
        if not term or self._count == 0:
            return None
        needle = term.encode("utf-8")
        exact = any(c.isupper() for c in term)
        if not exact:
            needle = needle.lower()
        buf = self._buf
        limit = self._offsets[self._count]
        reach = len(needle) - 1  # a match may start in a window and end past it

        def window(start: int, end: int) -> bytes:
            stop = min(limit, end + reach)
            if not self._intact(stop):
                raise _CutShorter
            data = buf[start:stop]
            self._release(start, stop)  # copied: a search through a 1.5 GB log kept all of it resident
            return data if exact else data.lower()  # ASCII case folding: bytes.find is far faster than re

        try:
            if not backward:  # window by window: other threads (the UI) run between windows
                position = self._offsets[min(from_line + 1, self._count)]
                while position < limit:
                    end = min(limit, position + SEARCH_WINDOW)
                    hit = window(position, end).find(needle)
                    if hit >= 0:
                        return self.line_of_offset(position + hit)
                    position = end
                return None
            stop = self._offsets[max(0, min(from_line, self._count))]
            while stop > 0:
                start = max(0, stop - SEARCH_WINDOW)
                data = window(start, stop)
                hit = data.rfind(needle, 0, stop - start + reach)
                if hit >= 0:
                    return self.line_of_offset(start + hit)
                stop = start
            return None
        except _CutShorter:
            return None  # the file is being read again from its start: nothing of the old text to find

    def match_lines(self, term: str, cap: int, keep: Callable[[int], bool] | None = None,
                    cancelled: Callable[[], bool] | None = None) -> tuple[array, bool]:
        """The 0-based lines (published ones) containing ``term``, in order, at most ``cap`` of them, and whether
        that is all of them (False: more than ``cap``, or cancelled). ``keep`` filters the lines (a rank facet);
        ``cancelled`` is asked between windows.

        Same matching as ``search`` (smart case). One Python step per matching line, not per line or byte: a
        count on a 1 GiB log with few matches is a few ``bytes.find`` calls.
        """
        lines = array("q")
        if not term or self._count == 0:
            return lines, True
        needle = term.encode("utf-8")
        exact = any(c.isupper() for c in term)
        if not exact:
            needle = needle.lower()
        limit = self._offsets[self._count]
        position = 0
        while position < limit:
            if cancelled is not None and cancelled():
                return lines, False
            end = min(limit, position + SEARCH_WINDOW)
            stop = min(limit, end + len(needle) - 1)
            if not self._intact(stop):
                return array("q"), False  # cut shorter: being read again, the old lines are gone
            data = self._buf[position:stop]
            self._release(position, stop)
            if not exact:
                data = data.lower()
            hit = data.find(needle)
            next_window = end
            while hit >= 0:
                line = self.line_of_offset(position + hit)
                if keep is None or keep(line):
                    lines.append(line)
                    if len(lines) > cap:  # one past the cap: there are more than ``cap``
                        lines.pop()
                        return lines, False
                line_end = self._offsets[line + 1]  # the next line: a line counts once
                if line_end >= end:
                    next_window = max(end, line_end)
                    break
                hit = data.find(needle, line_end - position)
            position = next_window
        return lines, True

    # ----------------------------------------------------------------------------------------- follow

    def start_following(self, poll_s: float = FOLLOW_POLL_S) -> str | None:
        """Index what is appended to the file from now on (``tail -f``), in a thread polling its size (network
        file systems give no change events). Returns why it cannot (a compressed log, standard input), else None.

        A last line without its newline yet is shown as it is and read again once it is complete.
        """
        if self._follow_thread is not None:
            return None
        refused = follow_refusal(self.path)
        if refused:
            return refused
        self.following = True
        self._follow_thread = threading.Thread(target=self._follow, args=(poll_s,), name=f"log-follow:{self.path}",
                                               daemon=True)
        self._follow_thread.start()
        return None

    def _follow(self, poll_s: float) -> None:
        self.done.wait()
        file_id: tuple[int, int] | None = None
        while not self._closed and self.following and self.error is None:
            time.sleep(poll_s)
            try:
                st = os.stat(self.path)
            except OSError:
                self.gone = True  # deleted, or moved away by a rotation: said on the status line, tried again
                continue
            came_back, self.gone = self.gone, False
            size, was = st.st_size, file_id
            file_id = (st.st_dev, st.st_ino)
            # copytruncate, ``: > job.log``, a job restarted into the same file; or another file under the name (a
            # rotation, a job that deleted and wrote it again: a file system may give it the old inode number),
            # whatever its size: read from its start (tail -F)
            if size < self.size or came_back or (was is not None and was != file_id):
                try:
                    with self._remap:
                        self._shrink_to(size)
                except (OSError, ValueError) as e:
                    self.follow_note = f"the file shrank; following stopped: {e}"
                    self.following = False
                    return
                self.truncations += 1
                continue
            if size > self.size and not self._closed:
                try:
                    with self._remap:
                        self._grow_to(size)
                except (OSError, ValueError) as e:
                    self.follow_note = f"following stopped: {e}"
                    self.following = False
                    return

    def _shrink_to(self, size: int) -> None:
        """The file was cut shorter (copytruncate, ``: > job.log``, a job restarted into the same file): what it
        holds now is read from its start, as ``tail -f`` does after "file truncated". Before, following stopped
        but the lines stayed on screen, read through the old map: drawing one past the new end touched pages the
        file no longer has (SIGBUS) and the TUI was gone."""
        self._count = 0  # readers see no line before anything else changes
        self._buf = b""  # the old map stays valid for a reader still holding it (never closed here)
        del self._offsets[1:]
        self.size = self.indexed_bytes = 0
        self.longest_line = 0
        if size:
            self._grow_to(size)

    def _grow_to(self, size: int) -> None:
        """Map the grown file and index its new lines; readers always see a consistent prefix."""
        with open(self.path, "rb") as fh:
            buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            watch, self._watch = self._watch, os.dup(fh.fileno())  # the file now mapped is the one to check
        if watch is not None:
            os.close(watch)
        size = len(buf)
        offsets = self._offsets
        if offsets[-1] == self.size + 1:  # the old last line had no newline: read it again, whole
            self._count = len(offsets) - 2
            offsets.pop()
        scan = offsets[-1]
        self._buf = buf  # the old map stays valid for a reader still holding it (never closed here)
        while scan < size and not self._closed:
            end = min(scan + self._chunk, size)
            parts = buf[scan:end].split(b"\n")
            if len(parts) > 1:
                starts = accumulate((len(p) + 1 for p in parts[:-1]), initial=scan)
                next(starts)
                offsets.extend(starts)
                self.longest_line = max(self.longest_line, max(len(p) for p in parts))
            self._count = len(offsets) - 1
            scan = end
        if offsets[-1] < size:
            offsets.append(size + 1)
            self.longest_line = max(self.longest_line, size - offsets[-2])
        self.size = self.indexed_bytes = size
        self._count = len(offsets) - 1

    def close(self) -> None:
        self._closed = True
        self.following = False
        self._running.set()
        if self._gate is not None:
            self._gate.set()
        for thread in (self._thread, self._follow_thread):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=5)
        if isinstance(self._buf, mmap.mmap):
            with contextlib.suppress(BufferError):  # a view still alive somewhere: the GC closes it
                self._buf.close()
        watch, self._watch = self._watch, None
        if watch is not None:
            with contextlib.suppress(OSError):
                os.close(watch)
        with contextlib.suppress(OSError, BufferError):
            self._inputs.close()  # closes the source and removes ingest's temporary files
