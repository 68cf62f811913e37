"""What the matcher reads from the normalize stage: the frames of the traceback that ends at a line.

Frames are matched by ``frames_any``/``frames_none`` and give a failure its phase. Python frames keep their log line
(a matched frame is shown as evidence with its line number); C++ frames are plain text (line number 0).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from diagnose.model import LogLine
from diagnose.normalize.tracebacks import Traceback, rebuild, traceback_ending_at

# ------------------------------------------------------------------------------------ a frame's file

# a Python frame line: ``  File "/x/y.py", line 3, in f``, after whatever prefix the traceback reader left on it
# (Ray's ``(MegatronPolicyWorker pid=188232, ip=10.12.6.41)   File "..."``): read with .search, never inside a word
FRAME_FILE = re.compile(r'(?:^|\s)File "([^"]*)"')
# where installed packages and the interpreter's own modules live (Python 2's /lib/python2.7 too)
_INSTALLED = ("site-packages/", "dist-packages/", "/lib/python")
# framework source trees often run from a checkout (/workspace/Megatron-LM/megatron/..., a torch built from source):
# library code too
LIBRARY_CHECKOUTS = ("/megatron/", "/nemo/", "/nemo_rl/", "/transformer_engine/", "/deepspeed/", "/torch/", "/apex/",
                     "/verl/", "/transformers/", "/accelerate/", "/lightning/", "/pytorch_lightning/", "/torchtitan/")


def frame_file(text: str) -> str:
    r"""The file of a Python frame line, with "/" separators (a Windows traceback: ``C:\...\site-packages\pkg``);
    "" for a line that is not a frame. The frame may follow a prefix (a Ray actor's): the lines read here are those
    the traceback reader took for frames."""
    m = FRAME_FILE.search(text)
    return m.group(1).replace("\\", "/") if m else ""


def is_library(path: str) -> bool:
    """Whether a frame's file (``frame_file``) is library code, not the job's own: an installed package, the
    interpreter's modules, a framework's checkout, or no file at all (``<frozen runpy>``, ``<string>``)."""
    at = "/" + path  # a relative path (torch/nn/modules/module.py) is read as one under a root
    return path.startswith("<") or any(r in at for r in _INSTALLED) or any(d in at for d in LIBRARY_CHECKOUTS)


# the outermost frame of a traceback that a package's console script started: pip's generated wrapper
# (``<env>/bin/axolotl``, ``/usr/local/bin/vllm``: a file with no extension in a bin/ folder, run as ``<module>``)
_CONSOLE_SCRIPT = re.compile(r'(?:^|\s)File "[^"]*/bin/([A-Za-z][\w-]*)", line \d+, in <module>')


def console_script_package(frames: Iterable[str]) -> str:
    """The package whose console script the traceback started from (``axolotl`` for ``<env>/bin/axolotl``, a dash
    read as an underscore), or "": the outermost frame is pip's wrapper for an installed distribution's entry
    point. Its frames are that package's code wherever its files live: an editable install (``pip install -e``)
    runs them from a checkout (``~/src/axolotl/src/axolotl/...``), not from site-packages."""
    outer = next((f for f in frames if FRAME_FILE.search(f)), "")
    m = _CONSOLE_SCRIPT.search(outer)
    return m.group(1).replace("-", "_") if m else ""


def traceback_frames(lines: list[LogLine]) -> list[LogLine]:
    """The frame lines of the traceback that ends at ``lines[-1]`` (``lines``: one stream, oldest first), with those
    of the exception groups it was raised inside (where it surfaced) and of its chained causes; [] when the line is
    not part of a traceback."""
    return traceback_reading(lines)[0]


def traceback_reading(lines: list[LogLine]) -> tuple[list[LogLine], LogLine | None]:
    """``traceback_frames`` of ``lines`` and, from the same reading, the source line printed under the innermost
    Python frame of that traceback (the ``assert`` statement above a bare ``AssertionError``): None when the line
    ends no traceback or the frame printed no source."""
    tb = traceback_ending_at(lines, len(lines) - 1)
    if tb is None:
        return [], None
    return _frames_of(tb, lines[-1].path), (tb.frames[-1].code_line if tb.frames else None)


def caused_frames(lines: list[LogLine], later: list[LogLine]) -> list[LogLine]:
    """The frames of the exceptions that the one ending at ``lines[-1]`` caused, outermost first; ``later``: the
    stream's lines after it. [] when it caused none.

    An exception that caused others ("During handling of the above exception", "The above exception was the direct
    cause") shows only the frames from where it was caught down to where it was raised; the exceptions it led to
    show the frames above (the save, the training step that called the code that failed)."""
    if not later:
        return []
    target = lines[-1]
    rebuilt = rebuild(lines + later)
    tb = next((t for t in rebuilt if any(ln is target for ln in t.lines)), None)
    if tb is None:
        return []
    caused = [t for t in rebuilt if any(c is tb for c in t.chain)]
    if not caused:
        return []
    outermost = max(caused, key=lambda t: len(t.chain))
    links = [t for t in outermost.chain if any(c is tb for c in t.chain)] + [outermost]
    return _lines_of(reversed(links), target.path)  # the outermost exception's frames first


def _frames_of(tb: Traceback, path: str) -> list[LogLine]:
    return _lines_of([*tb.groups, *tb.chain, tb], path)


def _lines_of(tracebacks: Iterable[Traceback], path: str) -> list[LogLine]:
    """The Python frames, then the C++ frames, of each traceback in turn, as log lines."""
    out: list[LogLine] = []
    for t in tracebacks:
        out.extend(LogLine(path=fr.log_line.path, lineno=fr.log_line.lineno, raw=fr.log_line.raw, text=fr.text)
                   for fr in t.frames)
        out.extend(LogLine(path=path, lineno=0, raw=cpp, text=cpp) for cpp in t.cpp_frames)
    return out


# faulthandler's dump after "Fatal Python error: Segmentation fault" (Python's own format, most recent call FIRST):
#     Current thread 0x00007f40... (most recent call first):
#       File "/usr/lib/python3.12/site-packages/torch/serialization.py", line 1268 in _save
# (faulthandler.dump_traceback(all_threads=False), and a fatal error with no thread state, head the block "Stack")
_FAULT_THREAD = re.compile(
    r"^(?:(?:Current thread|Thread) 0x[0-9a-fA-F]+ (?:\[[^\]]*\] )?|Stack )\(most recent call first\):\s*$"
)
_FAULT_FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<func>\S+)\s*$')
FAULT_HEADER_LINES = 4  # blank lines / the thread header may follow the error line after a line or two


def _is_crashed_thread_header(text: str) -> bool:
    """The header of the crashed thread's block: "Current thread 0x...", or "Stack" where faulthandler dumps one
    thread only; other threads' blocks ("Thread 0x...") are not the crash."""
    return text.startswith(("Current thread", "Stack (")) and bool(_FAULT_THREAD.match(text))


def faulthandler_frames(after: list[LogLine]) -> list[LogLine]:
    """The crashing thread's Python frames that faulthandler printed after a ``Fatal Python error`` line (``after``:
    the next lines of the same stream), innermost last and written like a traceback's frames (``File "x", line N,
    in f``) so that frame rules, the inferred category and the phase read them as they read a traceback; [] when no
    dump follows. Only the "Current thread" block (the one that crashed) is kept when several threads are dumped."""
    frames: list[LogLine] = []
    for ll in _after_header(after, _is_crashed_thread_header):
        m = _FAULT_FRAME.match(ll.text)
        if m is None:
            break
        frames.append(_as_frame(ll, m.group("file"), m.group("line"), m.group("func")))
    frames.reverse()
    return frames


def _after_header(after: list[LogLine], is_header) -> list[LogLine]:
    """The lines after the block's header (``is_header`` of a line's stripped text), which a crash handler prints
    within FAULT_HEADER_LINES of its error line (blank lines and other text may come first); [] when none does."""
    for i, ll in enumerate(after):
        text = ll.text.strip()
        if is_header(text):
            return after[i + 1:]
        if text and i >= FAULT_HEADER_LINES:
            return []
    return []


def _as_frame(ll: LogLine, file: str, line: str | int, func: str) -> LogLine:
    """A frame another format printed, written on its own log line as a traceback's frame (``File "x", line N, in
    f``), so that frame rules, the inferred category and the phase read it as they read a traceback."""
    return LogLine(path=ll.path, lineno=ll.lineno, raw=ll.raw, text=f'  File "{file}", line {line}, in {func}')


# UCX's signal handler (in any program that loads UCX: NVSHMEM, UCC, Open MPI, NIXL) reports a crash as one line and
# the native stack, innermost FIRST, starting with the handler's own frames:
#     [node1:4242:0:4242] Caught signal 11 (Segmentation fault: address not mapped to object at address 0x10)
#     ==== backtrace (tid:   4242) ====
#      0  /usr/lib/x86_64-linux-gnu/libucs.so.0(ucs_handle_error+0x2e4) [0x7f3c1a2e1fd4]
#      4  /opt/nvshmem/lib/nvshmem_transport_ibgda.so.3(nvshmemt_init+0x8c1) [0x7f3b8e613e11]
#     =================================
# UCX prints the pid left-justified in five columns ("[host:2714 :0:2803]"): a short pid is followed by spaces
UCX_SIGNAL = re.compile(r"^\[[^\]\s:]+:\d+ *:\d+:\d+\] Caught signal \d+ \(")
UCX_BACKTRACE_LINES = 80  # UCX prints up to ~60 frames
_UCX_HEAD = re.compile(r"^==== backtrace \(tid:\s*\d+\) ====\s*$")
# a frame is `N  /path/lib.so(symbol+0xoff) [0xaddr]`, or with debug info `N 0xaddr symbol()  file:line`
_UCX_FRAME = re.compile(
    r"^\s*\d+\s+(?:(?P<lib>/\S+?)\((?P<sym>[^)+]*)(?:\+0x[0-9a-fA-F]+)?\)\s+\[0x[0-9a-fA-F]+\]"
    r"|0x[0-9a-fA-F]+\s+(?P<dsym>[^\s(]+)\(\)\s+(?P<src>\S+?):\d+)\s*$"
)
# the handler and the signal trampoline at the top of the stack, not where the crash happened
_SIGNAL_PLUMBING = ("/libucs.so", "/libc.so", "ucs_handle_error", "ucs_debug_", "__sigaction", "__restore_rt")


def ucx_backtrace_frames(after: list[LogLine]) -> list[LogLine]:
    """The native frames UCX printed after its ``Caught signal`` line (``after``: the next lines of the same stream),
    innermost last and written like a traceback's frames (``File "lib.so", line 0, in symbol``) so that frame tables
    and the phase read them; the handler's own frames and unnamed offsets are left out. [] when no backtrace
    follows."""
    frames: list[LogLine] = []
    for ll in _after_header(after, lambda text: bool(_UCX_HEAD.match(text))):
        m = _UCX_FRAME.match(ll.text)
        if m is None:
            break
        lib = m.group("lib") or m.group("src")
        sym = (m.group("sym") if m.group("lib") else m.group("dsym")) or ""
        if not sym:
            continue  # an unnamed offset says nothing a reader can use
        if not frames and any(p in lib or p in sym for p in _SIGNAL_PLUMBING):
            continue  # the handler's frames come first (innermost); a crash in libc itself stays
        frames.append(_as_frame(ll, lib, 0, sym))
    frames.reverse()
    return frames


# gdb reports a signal that stopped the program it runs, then where it stopped and, after `bt`, the stack, innermost
# FIRST (gdb's own templates; a long frame continues on the next line with its library or source file):
#     Thread 787 "python" received signal SIGBUS, Bus error.          (or "Program received signal SIGSEGV, ...")
#     [Switching to Thread 0x7f45d7dff640 (LWP 3925)]
#     0x00007f6b59544f3b in ncclShmOpen(char*, unsigned long, ...) () from /usr/lib/libnccl.so.2
#     (gdb) bt
#     #0  0x00007f6b59544f3b in ncclShmOpen(char*, unsigned long, ...) ()
#        from /usr/lib/libnccl.so.2
#     #1  0x00007f6b595436d7 in ncclProxyService(void*) () from /usr/lib/libnccl.so.2
# Only the crash signals: gdb stops on SIGINT, SIGPIPE or SIGUSR1 too, which are no crash.
GDB_SIGNAL = re.compile(
    r'^(?:Program|Thread \d+(?: "[^"]*")?) received signal (?P<signal>SIG(?:SEGV|BUS|ABRT|ILL|FPE)), [^.]+\.\s*$'
)
GDB_BACKTRACE_LINES = 80
_GDB_FRAME = re.compile(r"^#(?P<n>\d+)\s+(?:0x[0-9a-fA-F]+\s+in\s+)?(?P<func>[^\s(]+)")
_GDB_STOP = re.compile(r"^0x[0-9a-fA-F]+\s+in\s+(?P<func>[^\s(]+)")  # where it stopped, printed before any `bt`
_GDB_WHERE = re.compile(r"(?:^|\s)(?:from|at) (?P<where>\S+?)(?::\d+)?\s*$")
_GDB_CHATTER = re.compile(r"^(?:\(gdb\)|\[(?:Switching to|New Thread|Thread 0x|Current thread)|\d+\s)")
_GDB_LEAD_LINES = 6  # the switch, the stop location, the prompt and a source line may come before the stack


def gdb_backtrace_frames(after: list[LogLine]) -> list[LogLine]:
    """The native frames gdb printed after its ``received signal`` line (``after``: the next lines of the same
    stream): the `bt` stack when one was asked for, else the location it stopped at; innermost last and written
    like a traceback's frames (``File "lib.so", line 0, in func``) so that frame rules and tables read them.
    Unnamed frames (``??``) are left out; [] when gdb printed neither."""
    found: list[tuple[str, str, LogLine]] = []  # (function, library or source, line), innermost first
    stop: tuple[str, str, LogLine] | None = None
    lead = 0
    for ll in after:
        text = ll.text.strip()
        m = _GDB_FRAME.match(text)
        if m is not None:
            where = _GDB_WHERE.search(text)
            found.append((m.group("func"), where.group("where") if where else "", ll))
            continue
        if found or stop is not None:
            where = _GDB_WHERE.match(text)
            if where is not None and text.startswith(("from ", "at ")):
                last = found[-1] if found else stop
                if last is not None and not last[1]:  # the frame's library, on the next line
                    entry = (last[0], where.group("where"), last[2])
                    if found:
                        found[-1] = entry
                    else:
                        stop = entry
                continue
        if found:
            break
        m = _GDB_STOP.match(text)
        if m is not None and stop is None:
            where = _GDB_WHERE.search(text)
            stop = (m.group("func"), where.group("where") if where else "", ll)
            continue
        if text and not _GDB_CHATTER.match(text):
            lead += 1
        if lead > _GDB_LEAD_LINES:
            break
    chosen = found or ([stop] if stop is not None else [])
    frames = [_as_frame(ll, where or "???", 0, func) for func, where, ll in chosen if func != "??"]
    frames.reverse()
    return frames


# pytest's failure report (the default long/auto traceback style): under the failing test's header, each call of the
# traceback shows its source and then its location `path:NNN: in func` (innermost last; the test's own frame is
# `path:NNN: ` with no function); the exception's lines start with `E   `, and the place it was raised follows them
# as `path:NNN: ExcType`:
#     ____________________________ test_save_load[2-1] ____________________________
#     tests/unit_tests/test_layout.py:212:
#     megatron/core/dist_checkpointing/serialization.py:148: in load
#     E           TypeError: load() got an unexpected keyword argument 'no_dist'
#     /env/lib/python3.12/site-packages/torch/distributed/checkpoint/utils.py:438: TypeError
PYTEST_ERROR = re.compile(r"^E {2,}\S")
_PYTEST_HEADER = re.compile(r"^_{3,} .+ _{3,}\s*$")
_PYTEST_CALL = re.compile(r"^(?P<file>[^\s:]+\.py):(?P<line>\d+):(?: in (?P<func>\S+))?\s*$")
_PYTEST_RAISE = re.compile(r"^(?P<file>[^\s:]+\.py):(?P<line>\d+): (?P<exc>[A-Za-z_][\w.]*)\s*$")
PYTEST_REPORT_LINES = 400  # a failure's report is a page or two: look no further for its header


def pytest_frames(before: list[LogLine], after: list[LogLine]) -> list[LogLine]:
    """The call locations of a pytest failure report whose `E   ` line is the evidence, written like a traceback's
    frames (innermost last) so that frame rules, the inferred category and the phase read them as they read a
    traceback. ``before``: the same stream's lines before the `E` line, nearest first (up to the test's header);
    ``after``: the lines after it, where pytest names the raise site. [] when no test header is found above."""
    calls: list[LogLine] = []
    for ll in before:
        text = ll.text.rstrip()
        if _PYTEST_HEADER.match(text):
            break
        m = _PYTEST_CALL.match(text)
        if m is not None:
            calls.append(_as_frame(ll, m.group("file"), m.group("line"), m.group("func") or "<test>"))
    else:
        return []  # no header: not a pytest report
    calls.reverse()
    for ll in after:
        text = ll.text.rstrip()
        if not text or PYTEST_ERROR.match(text):
            continue
        m = _PYTEST_RAISE.match(text)
        if m is not None:
            calls.append(_as_frame(ll, m.group("file"), m.group("line"), f"<raised {m.group('exc')}>"))
        break
    return calls


# IPython and Jupyter kernels (Colab, Kaggle notebooks) print an uncaught exception in IPython's own traceback format:
# the type heads it, then each call's location and source, outermost first; the exception line ends it:
#     ---------------------------------------------------------------------------
#     TypeError                                 Traceback (most recent call last)
#     /tmp/ipykernel_31/2214309554.py in <cell line: 0>()                  (IPython 7: "<file> in <function>(<args>)")
#     ----> 1 trainer_stats = trainer.train()
#     /usr/local/lib/python3.11/dist-packages/transformers/trainer.py in train(self, resume_from_checkpoint, ...)
#     -> 2245             return inner_training_loop(
#     File /usr/lib/python3.11/site-packages/transformers/trainer.py:2245, in Trainer.train(self, ...)  (IPython 8)
#     Cell In[3], line 1
#     TypeError: _unsloth_get_batch_samples() takes 3 positional arguments but 4 were given
_IPYTHON_WORDS = "Traceback (most recent call last)"
IPYTHON_HEADER = re.compile(r"^[A-Za-z_][\w.]*\s{2,}Traceback \(most recent call last\)\s*$")
_IPYTHON_CALL = re.compile(
    r"^(?:(?P<file>/\S+?\.py|<ipython-input-[^>\s]+>) in (?P<func><[^<>]*>|[^\s(]+)\("
    r"|File (?P<file8>\S+?\.py):(?P<line8>\d+), in (?P<func8>[^\s(]+)\()"
)
_IPYTHON_ARROW = re.compile(r"^-*> ?(?P<line>\d+)\b")  # the line the call stopped on, under the location


def ipython_frames(lines: list[LogLine]) -> list[LogLine]:
    """The calls of an IPython/Jupyter traceback whose exception line is ``lines[-1]`` (``lines``: the same stream,
    oldest first), written like a traceback's frames (innermost last) so that frame tables, the inferred category
    and the phase read them as they read Python's own traceback; [] when no IPython header is found above.

    IPython prints no ``File "..."`` lines, so Python's traceback reading finds no frame in a notebook's log: the
    failure would read as raised nowhere (neither in a library nor in the user's code)."""
    header = next((i for i in range(len(lines) - 2, -1, -1)
                   if _IPYTHON_WORDS in lines[i].text and IPYTHON_HEADER.match(lines[i].text.strip())), None)
    if header is None:
        return []
    frames: list[tuple[LogLine, str, str, str]] = []
    for ll in lines[header + 1:-1]:
        text = ll.text.strip()
        m = _IPYTHON_CALL.match(text)
        if m is not None:
            if m.group("file8"):
                frames.append((ll, m.group("file8"), m.group("line8"), m.group("func8")))
            else:
                frames.append((ll, m.group("file"), "0", m.group("func")))
            continue
        arrow = _IPYTHON_ARROW.match(text)
        if arrow is not None and frames and frames[-1][2] == "0":
            last = frames[-1]
            frames[-1] = (last[0], last[1], arrow.group("line"), last[3])
    return [_as_frame(ll, file, line, func) for ll, file, line, func in frames]
