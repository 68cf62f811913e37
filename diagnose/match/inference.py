"""A generic finding's category, read from its evidence as a human would: the traceback's frames, the exception type,
where it was raised, the words of the line.

Generic rules (``tier = "generic"``: the shape of a Python exception, an assertion, a native crash) know that a
failure happened but not what kind. The catalogue's ``[[infer]]`` tables (``rules/05_inference.toml``) say what
each kind of evidence means: a frame in ``megatron/core/dist_checkpointing/`` puts it in checkpointing, an
``unexpected keyword argument`` raised inside an installed package is version skew. The first table whose
conditions all hold decides (file order, as Dr. CI's rules). The finding keeps the rule it came from and says how
its category was reached (``Finding.basis``), with a confidence between the generic rule's and a specific rule's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import regex

from diagnose.lazy_re import LazyPattern
from diagnose.match.frames import FRAME_FILE, LIBRARY_CHECKOUTS, console_script_package, frame_file, is_library
from diagnose.match.rules import Inference

# pytest shows the exception on lines starting with "E   " (its failure report): the type follows that margin
_MARGIN = r"^(?:E {2,})?"
# At most 16 dotted segments before the class name, as in the rules that read the same name (PY001, PY010...): an
# unbounded (?:name\.)* retried every segment of a long dotted line (2 s at the 256 KiB the engine reads); real names
# have at most 5 or 6 (torch.distributed.elastic.multiprocessing.errors.ChildFailedError)
_EXC_TYPE = LazyPattern(
    _MARGIN + r"((?:[A-Za-z_]\w*\.){0,16}[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Failure|Warning))\b"
)
_AFTER_MARGIN = LazyPattern(_MARGIN)
_FRAME_HEAD = LazyPattern(r'File "[^"]*", line \d+, in \S+')
MAX_FRAMES = 32  # the innermost frames kept on a generic hit; where it was raised is at the end


@dataclass(frozen=True, slots=True)
class Inferred:
    inference: Inference
    detail: str  # the evidence that decided it: the frame, the type or the words

    @property
    def basis(self) -> str:
        return f"{self.inference.code}: {self.inference.why} ({self.detail})"


def exception_type(text: str, captured: str = "") -> str:
    """The exception's type name at the start of ``text`` ("" when the line is not an exception line).

    A name ending as exception classes usually do (``...Error``, ``...Exception``, ...) is read here. Any other is
    the one the rule that read the line captured (``captured``: its ``exc_type`` group), where the line starts with
    it: what a class name looks like is the rule's to say (PY013's ``traceback_ends_with`` reads huggingface_hub's
    OfflineModeIsEnabled or a library's ...Timeout at the end of a traceback, PY010 a class of an errors module)."""
    stripped = text.strip()
    m = _EXC_TYPE.match(stripped)
    if m:
        return m.group(1)
    margin = _AFTER_MARGIN.match(stripped)
    rest = stripped[margin.end():] if margin else stripped
    if captured and rest.startswith(captured) and rest[len(captured) : len(captured) + 1] in ("", ":"):
        return captured
    return ""


# Python's own TypeError for a call that does not fit its callee's signature ("f() missing 1 required positional
# argument: 'x'"): the function's name, "()", then one of the interpreter's wordings
_SIGNATURE_MISMATCH = LazyPattern(
    r"\b\w+\(\) (?:got an unexpected keyword argument '\w+'|got multiple values for argument '\w+'"
    r"|missing \d+ required (?:positional|keyword-only) arguments?: "
    r"|takes (?:from )?\d+ (?:to \d+ )?positional arguments? but \d+ (?:were|was) given)"
)


def carried_type(text: str, exc: str) -> str:
    """The type of the exception whose message another one carries: "TypeError" when ``text`` (an exception line of
    type ``exc``, not itself a TypeError) repeats the interpreter's own signature-mismatch TypeError, as a worker
    pool or an async writer re-raises a failure of its worker (``RuntimeError: Worker failure: _write_item() missing
    1 required positional argument: 'serialization_format'``); "" otherwise.

    A reader sees the TypeError through its wrapper: what failed is a call that did not fit its callee, and the
    tables that read a TypeError read it (the wrapper's frames still say where it surfaced)."""
    if not exc or exc == "TypeError" or exc.endswith(".TypeError"):
        return ""
    return "TypeError" if _SIGNATURE_MISMATCH.search(text) else ""


_LIBRARY_CALL = LazyPattern(
    r"\b(?:deepspeed|torch|transformer_engine|te|apex|megatron|nemo|transformers|accelerate|flash_attn|vllm)\.\w"
)


_REFUSED_LEADING = LazyPattern(
    r"""^[\w.]*(?:Error|Exception):\s*['"`]?([^\s'"`]{1,80})['"`]?\s+is not (?:a )?valid\b"""
)
_QUOTED = LazyPattern(r"""['"`]([^'"`\n]{1,80})['"`]""")
# an unquoted refused value: "got fp8 - supported types are [...]", "Unknown quantization method: fp8. Must be one of"
_NAMED_VALUE = LazyPattern(
    r"""\b(?:got|type|method|name|value|mode|choice):?\s+['"`]?([\w.\-/]{1,80}?)['"`]?(?:[\s.,;]|$)"""
)
# the message's last list of names: [...] (Python reprs) or argparse's "(choose from ...)"
_LISTED = LazyPattern(r"(?:\[([^\[\]]{0,4000})\]|\(choose from ([^()]{0,4000})\))[^\[\]()]*$")
TYPO_EDITS = 2  # a refused name this close to a listed one is a typo of it, not a name of another release ...
SHORT_NAME = 4  # ... one edit only where either name is this short ("grpo" is no typo of "dpo")


def _edits(a: str, b: str, limit: int) -> int:
    """Levenshtein distance of ``a`` and ``b``, or ``limit + 1`` once it is known to exceed ``limit``."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
        if min(row) > limit:
            return limit + 1
    return row[-1]


def refused_unlike_listed(text: str) -> bool:
    """Is the name this message refused unlike every name it lists as accepted or similar (not a typo of one)?

    A check that refuses a name and lists what it accepts ("'save_period' is not a valid YOLO argument. Similar
    arguments are [...]", "adalomo is not a valid OptimizerNames, please select one of [...]") reads two ways: a
    misspelt setting ("imgsize" for "imgsz", "cosin" for "cosine") is configuration, while a well-formed name that
    resembles nothing listed is usually one the program's other release has (the docs of a newer release, a
    config of an older one). A listed ``name=default`` counts as ``name``; case, spaces, ``-`` and ``_`` are
    ignored. False when no refused name can be read."""
    line = text.strip()
    listed = _LISTED.search(line)
    which = (1 if listed.group(1) is not None else 2) if listed else 0
    items = listed.group(which) if listed else ""
    outside = line[: listed.start()] + line[listed.end(which) + 1 :] if listed else line  # the list's names aside
    lead = _REFUSED_LEADING.match(outside)
    quoted = _QUOTED.search(outside)
    named = None if lead or quoted else _NAMED_VALUE.search(outside)
    name = lead.group(1) if lead else (quoted.group(1) if quoted else (named.group(1) if named else ""))
    key = name.strip().lower().replace("-", "_")
    if not key:
        return False
    names = [q.split("=", 1)[0] for q in _QUOTED.findall(items)]
    for n in names:
        other = n.strip().lower().replace("-", "_")
        limit = 1 if min(len(key), len(other)) <= SHORT_NAME else TYPO_EDITS
        if _edits(key, other, limit) <= limit:
            return False
    return True


_PACKAGE_DIR = LazyPattern(r"(?:site|dist)-packages/([A-Za-z_]\w{1,60})/")
RELEASE_LOOKBACK_BYTES = 1 << 20  # how far before the error a release of the raising package is looked for


def raising_package(frames: Sequence[str]) -> str:
    """The installed package whose code raised (the innermost frame's ``site-packages/<package>/``), or ""."""
    m = _PACKAGE_DIR.search(innermost_frame(frames).replace("\\", "/"))
    return m.group(1) if m else ""


@lru_cache(maxsize=256)
def _release_pattern(package: str) -> regex.Pattern:
    name = regex.escape(package).replace("_", "[-_]").encode()
    after = rb"(?:[ _-]?version)?(?:==|=|: ?| v?|-v?|/v?)(\d+\.\d+(?:\.\d+)?)\b"  # ==4.41.2, 2.14.6, -8.0.20
    return regex.compile(rb"(?i)(?<![\w/.\\-])" + name + after)


def release_named_before(buffer, start: int, package: str, cache: dict | None = None) -> str:
    """``"<package> <version>"`` when the log names a release of ``package`` in the RELEASE_LOOKBACK_BYTES before
    offset ``start`` (pip's ``Successfully installed datasets-2.14.6``, a header's ``transformers=4.41.2``,
    ``ultralytics 8.0.20``), else "". The latest mention counts.

    A human who sees which release of the library that raised is installed reads a refused argument or key as that
    release's API, not as the user's setting. ``cache`` (one per input, calls in increasing ``start``) remembers per
    package how far the input was searched and the latest mention, so that many errors cost one pass."""
    if not package or start <= 0:
        return ""
    lo = max(0, start - RELEASE_LOOKBACK_BYTES)
    done, pos, value = (cache or {}).get(package, (0, -1, ""))
    if done > start:  # out of order: search afresh
        done, pos, value = 0, -1, ""
    for m in _release_pattern(package).finditer(bytes(buffer[max(lo, done) : start])):
        pos, value = max(lo, done) + m.start(), m.group(1).decode()
    if cache is not None:
        cache[package] = (start, pos, value)
    return f"{package} {value}" if value and pos >= lo else ""


# the name a refusal names: a keyword, key, field, attribute or option the raising code did not accept. IF261's
# text_any (rules/05_inference.toml) lists refusal wordings too: tests/test_refused_name_origin.py names, for every
# wording of either, which of the two reads it, so one added to one side only is a decision, not an oversight
_REFUSED_NAME = LazyPattern(
    r"""unexpected keyword argument '(\w+)'|doesn't have an? '(\w+)' (?:key|field|attribute|argument)"""
    r"""|has no (?:key|field|argument|parameter|option) '(\w+)'|^[\w.]*KeyError: '(\w+)'$"""
    r"""|(?i:unknown|unrecogni[sz]ed|unsupported|unexpected) """
    r"""(?:key|field|argument|parameter|option|kwarg)s?:? '(\w+)'"""
)
MIN_NAME = 3  # shorter names ("x", "id") are written everywhere: no evidence of who passed them


def refused_name(text: str) -> str:
    """The keyword, key or option the message says was refused (``trust_remote_code`` in ``... doesn't have a
    'trust_remote_code' key``), or ""."""
    m = _REFUSED_NAME.search(text.strip())
    name = next((g for g in m.groups() if g), "") if m else ""
    return name if len(name) >= MIN_NAME else ""


def name_written_by_other_package(text: str, frames: Sequence[str]) -> str:
    """The installed package whose own source line (a frame's code, printed in the traceback) writes the name that
    another installed package refused (raised deeper in the stack), or "".

    ``load_dataset(..., trust_remote_code=True)`` in ``site-packages/dspy/`` reaching ``site-packages/datasets/``,
    which says its config "doesn't have a 'trust_remote_code' key": neither the user's script nor the user's config
    wrote the name; one package's release passes it to another package's release that does not know it. Whatever
    the call was doing (loading data, a checkpoint, a model), two installed releases that do not fit together are
    the cause. A name the user's own script or command line wrote is left to the other tables."""
    name = refused_name(text)
    raiser = package_of(innermost_frame(frames))
    if not name or not raiser:
        return ""
    quoted = regex.escape(name)
    written = regex.compile(r"(?<![\w.])" + quoted + r"""\s*=(?!=)|['"]""" + quoted + r"""['"]""")
    for frame in frames:
        caller = package_of(frame)
        if not caller or caller == raiser:
            continue
        head = _FRAME_HEAD.search(frame)
        code = frame[head.end():] if head else ""
        if written.search(code):
            return caller
    return ""


# what a setting of the job looks like, written by a human: an environment variable (read in the raising line, or
# named as one), a quoted option string ``"expandable_segments:True"`` / ``"key=value"``, or a YAML entry as a
# config file writes it, one space after the colon (axolotl's "You should set `eval_sample_packing: False`"),
# ``name_with_parts=value``, a command-line ``--flag``, or advice to set a named option to a value ("Please set
# lora_modules_to_save to [`embed_tokens`, `lm_head`]": a snake_case name with parts between "set" and "to", which
# only an option's name is; a phrase, "set the device to", is not one). A name's parts are possessive (``*+``, ``++``):
# what follows a name ("=", a quote, " to") is none of its characters, and a backtracking name cost seconds on a
# 100 KB message of "a_a_a_..." (every way to end it tried again at each failure)
_SETTING_IN_MESSAGE = LazyPattern(
    r"""(?i:\benvironment variables?\b)|\b[A-Z][A-Z0-9]*+(?:_[A-Z0-9]++)++=\S"""
    r"""|['"`][a-z]\w*(?:[:=]| ?= |: )(?:True|False|true|false|\d[\w.]*)['"`]"""
    r"""|(?<![\w.])[a-z][a-z0-9]*+(?:_[a-z0-9]++)++\s?=\s?(?:True|False|true|false|None|\d|['"])"""
    r"""|(?<![\w-])--[a-z][a-z0-9]*(?:[-_][a-z0-9]+)+\b"""
    r"""|\b[Ss]et ['"`]?[a-z][a-z0-9]*+(?:_[a-z0-9]++)++['"`]? to\b"""
)
_SETTING_IN_CODE = LazyPattern(
    r"""\bos\.environ\b|\bgetenv\(|\benviron\.get\("""
    r"""|['"`][a-z]\w*[:=](?:True|False|true|false|\d[\w.]*)['"`]"""
)
_ASSERT_STATEMENT = LazyPattern(r"^\s*assert\b")


def names_setting(text: str, frames: Sequence[str]) -> bool:
    """Does the message, or the assert statement that raised it, name a setting of the job?

    A check that refuses a combination often says only that two things "are not compatible"; what it tested is in
    its own line, which the traceback prints: ``assert "expandable_segments:True" not in conf`` names the
    PYTORCH_CUDA_ALLOC_CONF option the job set. A human reads a refusal that names a setting (an environment
    variable, a ``key=value`` or ``key:value`` option, a ``--flag``, advice to "set <option_name> to" a value) as the
    job's configuration, whatever library raised it. The raising line counts only where it is the assert statement
    itself (another line's code is not what was checked)."""
    if _SETTING_IN_MESSAGE.search(text) is not None:
        return True
    where = innermost_frame(frames)
    head = _FRAME_HEAD.search(where)
    code = where[head.end():] if head else ""
    return _ASSERT_STATEMENT.match(code) is not None and _SETTING_IN_CODE.search(code) is not None


# the source line of the innermost frame words an error message: an f-string (`f"Invalid auto wrap policy: {p}. Must
# be one of {list(POLICIES.keys())}"`), alone (the continuation line of a multi-line raise), after `raise X(` or an
# assignment (`msg = f"..."`), or a literal formatted with str.format / %. Only the opening is a regex; the literal's
# end is found with str.find, so a 100 KB source line costs one pass (one regex over the whole literal backtracked
# once per placeholder: 200 s for a line of "{}{}{}...).
_MESSAGE_OPENING = LazyPattern(
    r"""\s*(?:raise\s+(?P<raised>[\w.]+)\(\s*|[\w.]+\s*\+?=\s*)?(?P<f>[rR]?[fF]|[fF][rR])?(?P<q>["'])"""
)
_PLACEHOLDER = LazyPattern(r"\{\w*\}|%[sdr]")
_FORMATTED = LazyPattern(r"\s*(?:\.format\(|%)")


def _literal_end(code: str, start: int, quote: str) -> int:
    """Where the literal that starts at ``start`` ends: its next ``quote`` (the other quote is text inside it:
    ``f"Invalid policy '{p}'"``), or the end of the line."""
    end = code.find(quote, start)
    return end if end >= 0 else len(code)


def message_being_worded(frames: Sequence[str], exc_type: str = "") -> str:
    """The error message the raising line was wording (its literal, placeholders kept), or "".

    A check that refuses a value and then fails while formatting its own refusal (``list(D.keys())`` on a list, a
    ``None`` attribute in the f-string) ends in an AttributeError/TypeError/KeyError about the formatting, not about
    the job. The traceback prints the line that raised, and a human reads the message it was about to give:
    ``Invalid auto wrap policy: {self.auto_wrap_policy}. Must be one of ...`` says which setting was refused.
    An f-string counts when it has a placeholder; a plain literal when it has one (``{}``, ``{name}``, ``%s``) and
    is formatted right after (``.format(``, ``%``). ``exc_type``: the exception the log ended with; a line that
    raises that very type (``raise KeyError(f"Unknown key {k}")`` ending in a KeyError) delivered its message, it did
    not fail while wording it: ""."""
    where = innermost_frame(frames)
    head = _FRAME_HEAD.search(where)
    if not head:
        return ""
    code = where[head.end():]
    m = _MESSAGE_OPENING.match(code)
    if not m or (exc_type and m.group("raised") and
                 m.group("raised").rsplit(".", 1)[-1] == exc_type.rsplit(".", 1)[-1]):
        return ""
    end = _literal_end(code, m.end(), m.group("q"))
    literal = code[m.end():end]
    if m.group("f"):
        return literal.strip() if "{" in literal else ""
    if end == len(code) or not _PLACEHOLDER.search(literal):
        return ""
    return literal.strip() if _FORMATTED.match(code, end + 1) else ""


def package_of(frame: str) -> str:
    """The package a frame's file belongs to: ``site-packages/<package>/``, else a framework's checkout
    (``/opt/Megatron-LM/megatron/...``: ``megatron``); "" for the user's own files."""
    path = frame_file(frame)
    if not path:
        return ""
    installed = _PACKAGE_DIR.search(path)
    if installed:
        return installed.group(1)
    at = min(((path.find(d), d) for d in LIBRARY_CHECKOUTS if d in path), default=None)
    return at[1].strip("/") if at else ""


def frame_head(frame: str) -> str:
    """A frame's location, ``File "...", line N, in function``, without what precedes it nor the source line the
    traceback printed under it (which the frame's text carries after the function): what a finding's basis quotes,
    and where a ``raising_frames_any`` needle naming a function is looked for: where the code ran, not what a line
    of it called (``model = X.from_pretrained(cfg["path"])`` raising the user's own KeyError is no from_pretrained
    frame; qa-report-19 L1)."""
    head = _FRAME_HEAD.search(frame)
    return head.group(0) if head else frame.strip()


def innermost_frame(frames: Sequence[str]) -> str:
    """The innermost ``File "..."`` frame of a traceback (where the exception was raised), or ""."""
    return next((text for text in reversed(frames) if FRAME_FILE.search(text)), "")


def raising_frames(frames: Sequence[str]) -> list[str]:
    """The frames of the code that raised, innermost first: the innermost ``File "..."`` frame and the frames right
    above it that belong to the same package (``package_of``; the user's own files count as one), up to the first
    frame of another package. An outer entry point (transformers' ``from_pretrained``, which also parses configs,
    builds the model and runs DeepSpeed's ``zero.Init``) is not among them when another package raised below it."""
    files = [text for text in frames if FRAME_FILE.search(text)]
    if not files:
        return []
    package = package_of(files[-1])
    run: list[str] = []
    for text in reversed(files):
        if package_of(text) != package:
            break
        run.append(text)
    return run


_FRAME_WHERE = LazyPattern(r'File "([^"]*)", line (\d+), in (\S+)')


def raised_at(frame: str) -> str:
    """Where the exception was raised, as a reader names it, from the traceback's innermost frame
    (``innermost_frame``): its file (from the package's own folder for an installed package:
    ``mbridge/core/util.py``; else the last three parts of the path), line and function
    (``mbridge/core/util.py:83 in build_model``); "" when it is no Python frame."""
    m = _FRAME_WHERE.search(frame.replace("\\", "/"))
    if m is None:
        return ""
    path, line, function = m.group(1), m.group(2), m.group(3)
    installed = _PACKAGE_DIR.search(path)
    shown = path[installed.start(1):] if installed else "/".join(path.split("/")[-3:])
    return f"{shown}:{line} in {function}"


# the one frame of a program given on the command line (``python -c``) or on stdin: no file, yet the user's code
_PROGRAM_ON_COMMAND_LINE = LazyPattern(r'File "<(?:string|stdin)>", line \d+, in <module>')


def raised_in_library(frames: Sequence[str]) -> bool:
    """Was the innermost Python frame in a package (installed, or a framework's checkout), not the user's script?
    (frames.is_library: the one reading of a frame's file that the stack's reading shares.)

    A call that does not fit a signature raises at the caller: when the caller is Megatron calling Transformer
    Engine, two libraries disagree on a version; when it is the user's own script, the script is wrong, unless the
    line it stopped on calls into a library (``deepspeed.zero.Init(...)``): then the library changed its API. A
    package's console script (``<env>/bin/axolotl``) that started the traceback makes that package's frames library
    code where an editable install keeps them in a checkout (``~/src/axolotl/src/axolotl/core/...``)."""
    outermost = next((i for i, f in enumerate(frames) if FRAME_FILE.search(f)), None)
    for i in reversed(range(len(frames))):
        text = frames[i]
        m = FRAME_FILE.search(text)
        if m:
            path = frame_file(text)
            if i == outermost and _PROGRAM_ON_COMMAND_LINE.search(text):
                return False  # `python -c '...'` (or a script on stdin) raised in its own top level: the user's code
            if is_library(path):  # a Windows traceback too: C:\Users\u\...\site-packages\pkg
                return True
            entry = console_script_package(frames)
            if entry and f"/{entry}/" in "/" + path:
                return True
            code = text[m.end():]  # the frame's source line, when the traceback printed it
            return _LIBRARY_CALL.search(code) is not None
    return False


_MODULE_FRAME = LazyPattern(r'File "[^"]*", line \d+, in <module>')


def imported_package(frames: Sequence[str]) -> str:
    """The file of an installed package's module that was being imported when the exception came, or "".

    An ``import`` runs the imported module's top level, which Python shows as a second ``in <module>`` frame under
    the one of the script (or module) whose import statement ran it: the innermost ``<module>`` frame, when it is
    library code below another ``<module>`` frame, is the package being imported (``from unsloth import ...`` ->
    ``unsloth/__init__.py <module>`` -> the function its top level called that raised). A module run as the main
    program (``python -m pkg.train``, runpy) has a single ``<module>`` frame, so an error of its run is not read as
    one of its import."""
    modules = [f for f in frames if _MODULE_FRAME.search(f)]
    if len(modules) < 2:
        return ""
    path = frame_file(modules[-1])
    return path if is_library(path) else ""


def infer(
    inferences: Sequence[Inference], rule_code: str, text: str, frames: Sequence[str], phase: str,
    release: str = "", exc_type: str = "",
) -> Inferred | None:
    """The first ``[[infer]]`` table whose conditions all hold for this evidence, or None. ``release``: the release
    of the raising package that the log named before the line (``release_named_before``), or "". ``exc_type``: the
    exception type the rule captured from the line (its ``exc_type`` fact), or ""."""
    exc = exception_type(text, exc_type)
    carried = carried_type(text, exc)
    library: bool | None = None
    # a Windows traceback (File "C:\...\site-packages\datasets\builder.py") is read with the same path needles
    frames = [f.replace("\\", "/") if "\\" in f else f for f in frames]
    for inf in inferences:
        if inf.rules and rule_code not in inf.rules:
            continue
        if inf.phases and phase not in inf.phases:
            continue
        detail = ""
        if inf.exc_types:
            hit = next((t for t in inf.exc_types if exc == t or exc.endswith("." + t)), None)
            if hit is None and carried in inf.exc_types:
                hit = carried
            if hit is None:
                continue
            detail = exc if hit != carried else f"{exc} carrying a {carried}'s message"
        if inf.text_any:
            found = next((m for t in inf.text_any if (m := regex.search(t, text)) is not None), None)
            if found is None:
                continue
            detail = detail or found.group(0)
        if inf.text_none and any(regex.search(t, text) is not None for t in inf.text_none):
            continue
        if inf.frames_any:
            frame = next((f for f in reversed(frames) for needle in inf.frames_any if needle in f), None)
            if frame is None:
                continue
            detail = frame_head(frame)
        if inf.frames_none and any(needle in f for f in frames for needle in inf.frames_none):
            continue
        if inf.raised_in:
            where = innermost_frame(frames)
            if not any(needle in where for needle in inf.raised_in):
                continue
            detail = frame_head(where)
        if inf.raised_none and any(needle in innermost_frame(frames) for needle in inf.raised_none):
            continue
        if inf.raised_match:
            where = innermost_frame(frames)
            found = next((m for t in inf.raised_match if (m := regex.search(t, where)) is not None), None)
            if found is None:
                continue
            detail = f"{detail}; raised at {found.group(0)[:80]!r}" if detail else f"raised at {found.group(0)[:80]!r}"
        if inf.raising_frames_any:
            frame = next((f for f in raising_frames(frames) for needle in inf.raising_frames_any
                          if needle in frame_head(f)), None)
            if frame is None:
                continue
            raiser = frame_head(frame)
            detail = f"{detail}; {raiser}" if detail and detail != raiser else raiser
        if inf.library_frame is not None:
            if library is None:
                library = raised_in_library(frames)
            if library != inf.library_frame:
                continue
            detail = detail or ("raised inside an installed package" if library else "raised in the user's code")
        if inf.during_import is not None:
            imported = imported_package(frames)
            if bool(imported) != inf.during_import:
                continue
            if imported:
                importing = f"raised while {imported} was being imported"
                detail = f"{detail}; {importing}" if detail else importing
        if inf.refused_unlike_listed is not None and refused_unlike_listed(text) != inf.refused_unlike_listed:
            continue
        if inf.name_written_by_other_package is not None:
            caller = name_written_by_other_package(text, frames)
            if bool(caller) != inf.name_written_by_other_package:
                continue
            if caller:
                refuser = package_of(innermost_frame(frames))
                detail = f"{detail}; the name is written in {caller}'s code, refused by {refuser}"
        if inf.names_setting is not None and names_setting(text, frames) != inf.names_setting:
            continue
        if inf.message_any:
            worded = message_being_worded(frames, exc)
            if not worded or not any(regex.search(t, worded) is not None for t in inf.message_any):
                continue
            wording = f"raised while wording the message {worded[:120]!r}"
            detail = f"{detail}; {wording}" if detail else wording
        if inf.release_named is not None:
            if bool(release) != inf.release_named:
                continue
            detail = f"{detail}; the log names {release}" if release else detail
        return Inferred(inf, detail[:200])
    return None
