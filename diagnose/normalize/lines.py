"""Turn one raw log line into a :class:`~diagnose.model.LogLine`: the message plus the transport around it.

Logs of large jobs are wrapped in layers, outermost first, e.g.::

    node017: 3: [default0]:[rank24]:[E1129 15:25:31.123456789 ProcessGroupNCCL.cpp:683] [PG 0 Rank 24] Watchdog...
    ^pdsh    ^srun --label ^torchrun --tee ^torch rank  ^c10 glog header

``normalize_line`` peels those layers one at a time from the start of the line (in any order, any depth) and keeps
what they say in the LogLine fields (rank, local_rank, host, timestamp, level). The message text keeps everything
after the last prefix. ANSI escapes are removed and ``\\r`` rewrites are collapsed to what a terminal shows. The
margin of a Python exception group printout (``    | ``) is the innermost layer: its depth goes to ``group_depth``.

Speed matters (the matcher calls this on every candidate line) so the common case is a handful of
``str`` checks and one anchored regex attempt per layer. Nothing here raises: any input gives a LogLine.
"""

from __future__ import annotations

import codecs
import re
from typing import TYPE_CHECKING, cast

from diagnose.model import LogLine

if TYPE_CHECKING:  # learned.py reads lines through normalize_line: only its type is named here
    from diagnose.normalize.learned import LearnedPrefixes

# ---------------------------------------------------------------------------------------------- decode


def _escape_bad_bytes(error: UnicodeError) -> tuple[str, int]:
    err = cast(UnicodeDecodeError, error)  # registered for decoding only
    bad = err.object[err.start : err.end]
    return "".join(f"\\x{b:02x}" for b in bad), err.end


codecs.register_error("diagnose_hex", _escape_bad_bytes)


def decode(data: bytes | bytearray | memoryview) -> str:
    """UTF-8 with every invalid byte shown as ``\\xNN`` and NUL shown as ``\\x00`` (never a real NUL)."""
    if type(data) is not bytes:
        data = bytes(data)
    try:
        text = data.decode("utf-8")  # the common case, without the error-handler lookup
    except UnicodeDecodeError:
        text = data.decode("utf-8", "diagnose_hex")
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    return text


# ---------------------------------------------------------------------------------------------- ANSI / \r

# CSI: ESC [ params intermediates final; OSC: ESC ] ... (BEL | ESC \\); DCS/SOS/PM/APC: ESC P/X/^/_ ... ESC \\;
# other two/three-byte escapes: ESC followed by intermediates and one final byte. A lone 8-bit CSI (\x9b) too.
_ANSI = re.compile(
    r"""
      \x1b\[ [0-?]* [ -/]* [@-~]?          # CSI (final byte optional: a truncated sequence is still dropped)
    | \x9b [0-?]* [ -/]* [@-~]?            # 8-bit CSI
    | \x1b\] [^\x07\x1b]* (?:\x07|\x1b\\)?  # OSC ... BEL or ST
    | \x1b[PX^_] [^\x1b]* (?:\x1b\\)?       # DCS, SOS, PM, APC ... ST
    | \x1b [ -/]* [0-~]?                   # any other escape (ESC c, ESC (B, ESC 7 ...)
    """,
    re.VERBOSE,
)
# Erase-in-line (ESC[K, ESC[2K...) after a carriage return means the terminal shows only the new text.
_ERASE_LINE = re.compile(r"\x1b\[[012]?K")


def strip_ansi(text: str) -> str:
    if "\x1b" not in text and "\x9b" not in text:
        return text
    return _ANSI.sub("", text)


# the start of an exception line ("RuntimeError: ...", "torch.OutOfMemoryError: ..."), as PY001 reads one
_EXCEPTION_START = re.compile(r"(?:[A-Za-z_]\w*\.){0,16}[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit): ")


def collapse_carriage_returns(text: str) -> str:
    """What a terminal shows after printing ``text``: each ``\\r`` returns to column 0 and overwrites.

    A trailing ``\\r`` (CRLF files, tqdm's last refresh) changes nothing on screen and is ignored. One exception: a
    line that starts with an exception's own line (``RuntimeError: CUDA error: ...``) before its first ``\\r`` is
    that exception, whatever a progress bar redrew over it before the newline came (another thread's tqdm on the
    same stream): the screen would show the bar, and the log would read as no failure (qa-report-19 L9).
    """
    text = text.rstrip("\r")
    if "\r" not in text:
        return strip_ansi(text)
    first = text[: text.index("\r")]
    if _EXCEPTION_START.match(first):
        return strip_ansi(first)
    # Walk the segments from the last one back: each shows its own text and, beyond its length, what earlier
    # (longer) segments left on screen, unless it erased the rest of the line. Linear in the line length.
    pieces: list[str] = []
    covered = 0
    for raw_segment in reversed(text.split("\r")):
        erased = "\x1b[" in raw_segment and _ERASE_LINE.search(raw_segment) is not None
        segment = strip_ansi(raw_segment)
        if len(segment) > covered:
            pieces.append(segment[covered:])
            covered = len(segment)
        if erased:
            break
    return "".join(pieces)  # pieces were found in screen order: columns 0.., then further right


# ---------------------------------------------------------------------------------------------- prefixes

# Every layer is tried at the current position with ``match``; alternatives share one compiled pattern so the
# common "no prefix" case costs one failed match. Each alternative ends in an empty group ``k_<layer>``: the last
# group a match closes (``Match.lastgroup``) names the layer.
_LAYER = re.compile(
    r"""
      \[(?P<role>[A-Za-z_][A-Za-z_]{0,31}?)(?P<role_n>\d{1,9})\]:(?P<k_role>)        # [default0]: [rank3]: [trainer1]:
    | \[(?P<mpi_job>\d{1,9}),(?P<mpi_rank>\d{1,9})\]<(?:stdout|stderr)>:\ ?(?P<k_mpi>)       # mpirun --tag-output
    | (?P<hvd_ts>(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)\ (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)\ [\ \d]\d
        \ \d\d:\d\d:\d\d\ \d{4})\[(?P<hvd_rank>\d{1,9})\]<(?:stdout|stderr)>:\ ?(?P<k_horovod>)  # horovodrun
    | \[rank:\ (?P<lrank>\d{1,9})\]\ ?(?P<k_lightning>)                                # Lightning "[rank: 3] "
    | \[(?P<bhost>[A-Za-z0-9][A-Za-z0-9._-]{0,252}):(?P<bhost_n>\d{1,9})\]:\ ?(?P<k_bhost>)     # [host:3]:
    | \[(?P<cglevel>[IWEF])(?P<cgdate>\d{4})\ (?P<cgtime>\d\d:\d\d:\d\d(?:\.\d+)?)
        (?:\ {1,8}\d{1,20})?(?:\ {1,8}[^\]\s]{1,255}:\d{1,9})?\]\ ?(?P<k_c10_glog>)  # [E1129 15:25:31.123 file.cpp:683]
    | (?P<glevel>[IWEF])(?P<gdate>\d{4})\ (?P<gtime>\d\d:\d\d:\d\d(?:\.\d+)?)
        \ {1,8}\d{1,20}\ {1,8}[^\]\s]{0,255}:\d{1,9}\]\ ?(?P<k_glog>)            # E1129 15:24:33.203000 421 f.py:986]
    | \[(?P<oglevel>[IWEF])\ [^\]\s]{1,255}:\d{1,9}\]\ ?(?P<k_old_glog>)             # [E ProcessGroupNCCL.cpp:475]
    | (?P<sglevel>[IWEF])(?P<sgdate>\d{4})\ (?P<sgtime>\d\d:\d\d:\d\d\.\d{1,9})
        \ (?P<k_short_glog>)                                                     # absl's short: E0803 23:08:13.511
    | \[pod/(?P<kpod>[a-z0-9][a-z0-9.-]{0,252})/(?P<kctr>[a-z0-9][a-z0-9-]{0,62})\]\ (?P<k_kubectl>)  # kubectl --prefix
    | (?P<dcname>[a-z0-9][\w.-]{0,127}?[-_]\d{1,6})\ +\|(?:\ |$)(?P<k_compose>)  # docker compose "trainer-1  | "
    | \ *(?P<task>\d{1,6}):\ (?!\d\d:)(?P<k_srun>)                                 # srun --label "  3: "
    | \ {0,2}\[(?P<pts>\d{4}-\d\d-\d\d[T\ ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)\]
        (?:\ (?P<plog>[\w.<>-]{1,255}):)?(?:\ \[(?P<plevel>[A-Z]{1,10})\])?\ ?(?P<k_logging>)  # [2024-07-25 06:36:18,2]
    | (?:(?P<sl_ts>(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)\ [\ \d]\d\ \d\d:\d\d:\d\d)
          \ (?P<sl_host>[A-Za-z0-9][\w.-]{0,252})\ (?P<sl_prog>[\w./@-]{1,64}?)(?:\[\d{1,10}\])?
        | (?P<sl_iso>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:?\d\d))
          \ (?P<sl_ihost>[A-Za-z0-9][\w.-]{0,252})\ (?P<sl_iprog>[\w./@-]{1,64}?)\[\d{1,10}\]
        ):\ (?P<k_syslog>)        # syslog, journalctl (short, short-iso): "Dec 17 18:09:08 node1 python[123]: "
    | (?P<ts>\d{4}-\d\d-\d\d[T\ ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)
        (?:\ +-\ +|\ +\|\ +|:\ |\ +|$)
        (?:(?P<tslevel>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)
           (?:\ +-\ +|:\ |\ +\|\ (?:[\w.<>-]{1,64}\ \|\ )?|\ +|$))?(?P<k_iso>)  # 2024-07-25T, FastChat
    | \[NeMo\ (?P<nlevel>[IWEDC])\ (?P<nts>\d{4}-\d\d-\d\d\ \d\d:\d\d:\d\d)\ [^\]]{0,255}\]\ ?(?P<k_nemo>)  # NeMo
      # (vLLM V1 tags a worker with its rank too: "(VllmWorker TP0 pid=12) "; NeMo-RL: "(Worker[rank=3] pid=12) ")
      # (vLLM's multiproc workers: "(VllmWorker rank=7 pid=12) "; ROLL: "(ActorWorker(actor_train-1) pid=12) ")
    | \((?:(?P<ray_actor>[A-Za-z_][\w.:-]{0,127}(?:\[rank=(?P<ray_rank>\d{1,9})\]|\([\w.:-]{1,127}\))?
        (?:\ [A-Z]{1,4}\d{1,6})?)(?:,\ |\ ))?
        (?:rank=(?P<ray_rank_kw>\d{1,9}),?\ )?pid=(?P<ray_pid>\d{1,9})
        (?:,\ ip=(?P<ray_ip>[0-9A-Fa-f.:]{2,64}))?\)\ ?(?P<k_ray>)          # Ray "(Worker pid=12, ip=10.0.0.1) "
    | (?P<vlevel>INFO|WARNING|ERROR)\ (?P<vmo>\d\d)-(?P<vd>\d\d)\ (?P<vtime>\d\d:\d\d:\d\d)(?:\.\d+)?
        \ \[?[\w.-]{1,255}:\d{1,9}\]\ ?(?P<k_vllm>)                   # vLLM "ERROR 06-03 08:14:22 [worker.py:148] "
    | \[(?P<mrank>\d{1,4})\]\ (?![a-z:])
        (?:\|\ (?P<mlevel>DEBUG|INFO|WARNING|ERROR|CRITICAL)\ \|\ )?(?P<k_monarch>)  # Monarch "[3] "
    | std(?:out|err):\ (?P<k_stream>)                          # a subprocess tee's stream tag "stderr: [rank0]: ..."
    | (?P<host>[a-z][a-z0-9-]{0,62}(?:\.[a-z0-9-]{1,63}){0,8}
        |\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}):\ (?P<k_pdsh>)  # pdsh "node017: ", "10.0.0.7: " (octets checked below)
    """,
    re.VERBOSE,
)

# torchx (NeMo-Run's launcher) writes "role/replica " before torchrun's own "[default3]:" (the outermost layer only: a
# separate pattern, tried only where a line starts with a lower-case name and a "/", keeps its cost off the others).
_TORCHX = re.compile(r"(?P<role>[A-Za-z_][\w.-]{0,127})/(?P<replica>\d{1,6})\ (?=\[)")

# Tokens shaped like host names that are really config keys or program names ("bf16: true", "slurmstepd-n1: ").
_NOT_A_HOST = re.compile(r"(?:bf|fp|tf|int|uint|mxfp|nvfp|e\dm)\d+$|slurmstepd|srun|sbatch|salloc")

# Characters a prefix can start with; anything else skips the regex entirely.
_PREFIX_START = frozenset("[( 0123456789IWEFabcdefghijklmnopqrstuvwxyz")
# horovodrun stamps each line with a ctime date ("Tue Nov 10 10:05:04 2020[13]<stderr>:"), syslog and journalctl with
# a month and a day ("Dec 17 18:09:08 node1 python[123]: "): of the lines starting with an upper-case letter other
# than IWEF, only those whose first three letters are a weekday or a month try the prefix regex.
_DATE_WORDS = frozenset(("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun", "Jan", "Feb", "Mar", "Apr", "May", "Jun",
                         "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"))
_DATE_INITIALS = frozenset(word[0] for word in _DATE_WORDS)
_MAX_LAYERS = 8


def _may_start_prefix(text: str, pos: int = 0) -> bool:
    """Can a known layer start at ``pos`` of ``text``? The cheap gate before the prefix regex (a hot path)."""
    first = text[pos]
    return first in _PREFIX_START or (first in _DATE_INITIALS and text[pos : pos + 3] in _DATE_WORDS)


def normalize_line(raw: str, path: str = "", lineno: int = 0, learned: LearnedPrefixes | None = None) -> LogLine:
    """Normalise one line (without or with its line ending). Never raises.

    ``learned``: the prefixes the line's input taught (diagnose.normalize.learned), peeled after the known layers."""
    try:
        return _normalize(raw, path, lineno, learned)
    except Exception:  # noqa: BLE001  # pragma: no cover - defensive: a bug here must not take the whole scan down
        return LogLine(path=path, lineno=lineno, raw=str(raw), text=str(raw))


def _normalize(raw: str, path: str, lineno: int, learned: LearnedPrefixes | None = None) -> LogLine:
    text = raw
    if text.endswith("\n"):
        text = text[:-1]
    raw_kept = text
    if "\r" in text:
        text = collapse_carriage_returns(text)
    elif "\x1b" in text or "\x9b" in text:
        text = strip_ansi(text)
    line = LogLine(path=path, lineno=lineno, raw=raw_kept, text=text)
    if not text or not _may_start_prefix(text):
        if learned is None or learned.pattern is None:  # (attributes, not bool(): this is the hot path)
            return line
    else:
        _peel_prefixes(line, text)
    if learned is not None and learned.pattern is not None:
        _peel_learned(line, learned)
    rest = line.text
    if rest.startswith("  ") and ("|" in rest or "+ Exception Group" in rest):  # cheap tests first: a hot path
        _peel_group_margin(line)
    return line


def _peel_learned(line: LogLine, learned: LearnedPrefixes) -> None:
    """Peel a prefix the input taught (after the known layers), then the known layers behind it."""
    n = learned.peel(line.text)
    if not n:
        return
    rest = line.text[n:]
    line.text = rest
    if rest and _may_start_prefix(rest):
        _peel_prefixes(line, rest)


# Python 3.11+ prints an ExceptionGroup with a margin: two spaces per nesting level, then "| " (or "+ " on the
# outermost "Exception Group Traceback" header); blank lines keep the margin ("    | ", or "    |" once trailing
# blanks are trimmed). The separators ("  +-+------ 1 ------") and the closing rule stay in ``text`` as they are:
# diagnose.normalize.tracebacks reads the nesting from them.
MAX_GROUP_DEPTH = 64
_GROUP_MARGIN = re.compile(
    r"(?P<indent>(?:  ){1," + str(MAX_GROUP_DEPTH) + r"})"
    r"(?:\|(?: |$)|\+ (?=Exception Group Traceback \(most recent call last\):))"
)


def _peel_group_margin(line: LogLine) -> None:
    m = _GROUP_MARGIN.match(line.text)
    if m is not None:
        line.group_depth = len(m.group("indent")) // 2
        line.text = line.text[m.end():]


# Layers that say a level and a time: the group of the level (when given), the groups of the time (joined by a space).
_LEVEL_AND_TIME = {
    "c10_glog": ("cglevel", ("cgdate", "cgtime")), "glog": ("glevel", ("gdate", "gtime")), "old_glog": ("oglevel", ()),
    "logging": ("plevel", ("pts",)), "iso": ("tslevel", ("ts",)), "nemo": ("nlevel", ("nts",)),
    "short_glog": ("sglevel", ("sgdate", "sgtime")),
}


def _peel_prefixes(line: LogLine, text: str) -> None:
    pos = 0
    srun_task: int | None = None
    saw_local = False
    saw_rank = False
    only_stamps = True  # every layer peeled so far was a time stamp alone (a collector's, before pdsh's host)
    end = len(text)
    if "a" <= text[0] <= "z" and text.find("/", 1, 130) > 0:
        m = _TORCHX.match(text)
        if m is not None:
            line.host = f"{m.group('role')}/{m.group('replica')}"  # the replica is a node: local ranks repeat across
            pos = m.end()
    for _ in range(_MAX_LAYERS):
        if pos >= end:
            break
        if not _may_start_prefix(text, pos):
            break
        m = _LAYER.match(text, pos)
        if m is None or m.end() == pos:
            break
        kind = (m.lastgroup or "")[2:]
        g = m.group
        stamps_before = only_stamps
        only_stamps = only_stamps and kind in ("iso", "logging") and not g("tslevel") and not g("plevel") \
            and not g("plog")
        if kind == "role":
            number = int(g("role_n"))
            if g("role") == "rank":
                line.rank = number
                saw_rank = True
                if text.startswith(" ", m.end()):
                    pos = m.end() + 1  # torch's excepthook writes "[rank3]: "; torchrun --tee "[default3]:"
                    continue
            else:
                line.local_rank = number
                saw_local = True
        elif kind == "srun":
            if srun_task is not None or saw_rank or saw_local or line.timestamp is not None:
                break  # "3: " after other prefixes is message text (e.g. "Failures: 3: ...")
            srun_task = int(g("task"))
        elif kind in _LEVEL_AND_TIME:
            level, stamp = _LEVEL_AND_TIME[kind]
            if g(level):
                line.level = g(level)
            if stamp:
                line.timestamp = " ".join(g(name) for name in stamp)
        elif kind == "mpi" or kind == "lightning":
            line.rank = int(g("mpi_rank") or g("lrank"))
            saw_rank = True
        elif kind == "horovod":
            line.rank = int(g("hvd_rank"))
            line.timestamp = g("hvd_ts")
            saw_rank = True
        elif kind == "ray":
            # Ray's log_to_driver (and launchers built on it) tag each actor's lines: the process is the stream, the
            # ip (when given) its host. The actor's name is its class ("EmbodiedFSDPActor", "VllmWorker TP0"), never
            # a host: many actors of one class run on many hosts.
            line.pid = int(g("ray_pid"))
            line.host = g("ray_ip") or line.host
            ray_rank = g("ray_rank") or g("ray_rank_kw")
            if ray_rank:  # NeMo-RL names its actors with their rank: "(MegatronPolicyWorker[rank=3] pid=12) "
                line.rank = int(ray_rank)
                saw_rank = True
        elif kind == "bhost":
            line.host = g("bhost")
            line.rank = int(g("bhost_n"))
            saw_rank = True
        elif kind == "monarch":
            # Monarch (torchforge) and some trainers' loggers tag each rank's line with "[3] ". A bare "[3] " is
            # also message text ("[0] : new", a numbered list): only the outermost layer, and never before a
            # lower-case word or a colon (see the lookahead); four digits at most (line-numbered excerpts use more).
            if saw_rank or saw_local or line.timestamp is not None \
                    or (pos != 0 and line.host is None and line.pid is None):
                break
            line.rank = int(g("mrank"))
            saw_rank = True
            if g("mlevel"):
                line.level = g("mlevel")[0]
        elif kind == "stream":
            if pos != 0:
                break  # a subprocess tee's "stderr: " is the outermost layer; later it is message text
        elif kind == "vllm":
            line.level = g("vlevel")[0]
            line.timestamp = f"{g('vmo')}{g('vd')} {g('vtime')}"  # glog-shaped: month and day, no year
        elif kind == "kubectl" or kind == "compose":
            if pos != 0 and not stamps_before:
                break  # the outermost layer (or after a collector's time stamp): later, "x-1 | " is a table's cell
            line.host = g("kpod") or g("dcname")  # the pod, the container: the stream the lines come from
        elif kind == "syslog":
            if line.host is not None or line.pid is not None:
                break
            line.host = g("sl_host") or g("sl_ihost")
            line.timestamp = g("sl_ts") or g("sl_iso")
        elif kind == "pdsh":
            host = g("host")
            first_label = host.split(".", 1)[0]
            # "node017", "10.0.0.7", "localhost", or a lettered machine of a small cluster ("gpu-b"): a word with
            # neither a digit nor a one-letter last part ("error", "cross-entropy") is message text.
            looks_like_host = (
                first_label == "localhost"
                or any(ch.isdigit() for ch in first_label)
                or (len(first_label) >= 3 and first_label[-2] == "-" and first_label[-1].isalpha())
            )
            if host[0].isdigit() and max(map(int, host.split("."))) > 255:
                break  # a dotted quad of numbers, not an address
            if (pos != 0 and not stamps_before) or line.host is not None or not looks_like_host \
                    or _NOT_A_HOST.match(host):
                # a pdsh host is the outermost layer, or comes right after a time stamp alone that a log collector
                # put before pdsh's line ("2023-12-17 18:09:08 10.0.1.12: "); "bf16: true" is a config line
                break
            line.host = host
        else:  # pragma: no cover - every alternative ends in a group listed above
            break
        pos = m.end()
    if srun_task is not None:
        if not saw_rank and not saw_local:
            line.rank = srun_task
        elif not saw_rank and line.host is None:
            # One torchrun per srun task: the task number names the node, local ranks repeat across nodes.
            line.host = f"task{srun_task}"
    if pos:
        line.text = text[pos:]
