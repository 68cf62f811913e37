"""Building a ConfigView from captured log blocks or from a file.

``from_blocks(blocks, findings)``: blocks are what the scanner captured for ``CAPTURES`` (by name).
``load_config(path)``: a Bridge YAML / ``run_config.yaml``, a Megatron-LM arguments dump or argument list, or a
whole log (scanned here for the same blocks, without the engine). Every value keeps its origin; release
defaults fill the rest (origin "default").
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterable

from diagnose.configview import ConfigView
from diagnose.explain.config import captures as C
from diagnose.explain.config import keycheck
from diagnose.explain.config.bridge_yaml import flatten_bridge, key_lines, looks_like_bridge
from diagnose.explain.config.cmdline import join_continuations, parse_command
from diagnose.explain.config.defaults import apply_defaults
from diagnose.explain.config.loglines import parse_ddp_repr, parse_env_line, parse_num_parameters, parse_world_size
from diagnose.explain.config.mlm_args import parse_arg_list, parse_args_dump
from diagnose.explain.config.providers import apply_provider
from diagnose.explain.config.summary import parse_summary
from diagnose.explain.config.tokenizers import apply_tokenizer_vocab
from diagnose.explain.config.version import infer_version
from diagnose.model import Block, DiagnoseError, Finding, LogLine
from diagnose.normalize import normalize_line

MAX_CONFIG_FILE_BYTES = 256 * 1024 * 1024
_MIXED_PRECISION = {  # Bridge presets (training/mixed_precision.py): what they set that the checks read
    "bf16_mixed": {"model.bf16": True, "optimizer.bf16": True, "ddp.grad_reduce_in_fp32": True},
    "bf16-mixed": {"model.bf16": True, "optimizer.bf16": True, "ddp.grad_reduce_in_fp32": True},
    "fp16_mixed": {"model.fp16": True, "optimizer.fp16": True, "ddp.grad_reduce_in_fp32": True},
    "16-mixed": {"model.fp16": True, "optimizer.fp16": True, "ddp.grad_reduce_in_fp32": True},
}


# captured one-line blocks: their parser and how the view's sources name them (None: not a source)
_ONE_LINE_BLOCKS: tuple[tuple[str, Callable[[LogLine, ConfigView], bool], str | None], ...] = (
    ("config.env_max_connections", parse_env_line, "environment"),
    ("config.env_alloc_conf", parse_env_line, "environment"),
    ("config.env_slurm", parse_env_line, "environment"),
    ("config.world_size", parse_world_size, "world size"),
    ("config.ddp_repr", parse_ddp_repr, "DistributedDataParallelConfig"),
    ("config.num_parameters", parse_num_parameters, None),
)


def from_blocks(
    blocks: dict[str, list[Block]] | None,
    findings: Iterable[Finding] = (),
    defaults: bool = True,
) -> ConfigView:
    """The job's config from captured blocks (unknown names are ignored) plus version clues from findings."""
    blocks = blocks or {}
    view = ConfigView()
    texts: list[str] = []

    for block in blocks.get("config.task_yaml", []):
        _parse_task_yaml(block, view)
        texts.append(C.TASK_CONFIG_BANNER)
    for block in blocks.get("config.summary", []):
        parse_summary(block.lines, view)
        view.framework = "megatron-bridge"
        view.sources.append(f"log:{block.start_line} Configuration Summary")
        texts.extend(line.text for line in block.lines[:1])
        texts.extend(line.text for line in block.lines if "sequence_length" in line.text)
    for block in blocks.get("config.mlm_args", []):
        parse_args_dump(block.lines, view)
        view.sources.append(f"log:{block.start_line} Megatron-LM arguments")
    for name in ("config.launch_torchrun", "config.launch_distrun", "config.launch_python"):
        for block in blocks.get(name, []):
            text, lineno = join_continuations(block.lines)
            before = len(view)
            parse_command(text, f"log:{lineno}", view)
            if len(view) > before:
                view.sources.append(f"log:{lineno} launch command")
    for name, parse, what in _ONE_LINE_BLOCKS:
        for block in blocks.get(name, []):
            for line in block.lines[:1]:
                if parse(line, view) and what:
                    _add_source(view, f"log:{line.lineno} {what}")
    for name, keys in (("config.te_missing", ("launch.transformer_engine", "launch.apex")),
                       ("config.apex_missing", ("launch.apex",))):
        for block in blocks.get(name, []):
            for key in keys:
                view.set(key, False, f"log:{block.lines[0].lineno}")
    for name in sorted(n for n in blocks if n.startswith("config.version_line")):
        for block in blocks.get(name, []):
            texts.extend(line.text for line in block.lines[:1])
    for f in findings:
        texts.extend(e.text for e in f.evidence)
    _finish(view, texts, defaults)
    return view


def _parse_task_yaml(block: Block, view: ConfigView) -> None:
    body: list[str] = []
    for line in block.lines[1:]:
        if line.text.strip().startswith(C.TASK_CONFIG_END):
            break
        body.append(line.text)
    from diagnose.explain.config.safe_yaml import safe_load  # here: a log without a YAML block never imports yaml

    data = safe_load("\n".join(body), what="Task Configuration block")
    if looks_like_bridge(data):
        part = flatten_bridge(data, f"log:{block.start_line}")
        view.model_target = view.model_target or part.model_target
        where = key_lines(body)
        for key, item in part.values.items():
            index = where.get(key)
            origin = f"log:{block.lines[1 + index].lineno}" if index is not None else item.origin
            view.set(key, item.value, origin)
        view.framework = "megatron-bridge"
        view.sources.append(f"log:{block.start_line} Task Configuration")


def _add_source(view: ConfigView, source: str) -> None:
    if source not in view.sources:
        view.sources.append(source)


def _finish(view: ConfigView, texts: list[str], defaults: bool) -> None:
    version, mcore, clues = infer_version(texts)
    view.version = view.version or version
    view.mcore_version = view.mcore_version or mcore
    view.version_clues.extend(c for c in clues if c not in view.version_clues)
    apply_provider(view)
    apply_tokenizer_vocab(view)
    preset = view.get("mixed_precision")
    if isinstance(preset, str) and preset in _MIXED_PRECISION:
        for key, value in _MIXED_PRECISION[preset].items():
            if not view.has(key):
                view.set(key, value, view.origin("mixed_precision") or "default")
    if not view.has("model.seq_length"):
        for key in ("dataset.seq_length", "dataset.sequence_length"):
            if view.has(key):
                view.set("model.seq_length", view.get(key), view.origin(key) or "default")
                break
    if defaults and view.known():
        apply_defaults(view)


# ------------------------------------------------------------------------------------------------ files


def load_config(path: str, defaults: bool = True) -> ConfigView:
    """Read a config file (any supported kind, detected from its content). DiagnoseError on bad input."""
    path = resolve_config_path(path)
    text = _read(path)
    name = os.path.basename(path)
    if _looks_like_log(text):
        view = from_blocks(blocks_from_lines(lines_of(text, path)), defaults=defaults)
        if not view.known():
            raise DiagnoseError(f"no configuration found in {name} (no config block, arguments dump or launch line)")
        return view
    joined = re.sub(r"\\[ \t]*\r?\n", " ", text.lstrip())  # shell line continuations, as upstream scripts write them
    if joined.startswith("--") or re.match(r"^(\S+\.py\s+)?--[a-z]", joined):
        view = ConfigView(framework="megatron-lm")
        tokens = joined.split()
        _refuse_bridge_overrides(tokens, name)
        parse_arg_list([t for t in tokens if not t.endswith(".py")], f"file:{name}", view)
        keycheck.check_mlm_flags([k[4:] for k in view.values if k.startswith("mlm.")], name)
        # a flag given several values where its field takes one (`--pipeline-model-parallel-size 1 2`: argparse's
        # "unrecognized arguments") was kept as a list and crashed the validator (found by tests/fuzz/fuzz_cli.py)
        keycheck.check_values({k: v.value for k, v in view.values.items() if not k.startswith("mlm.")}, name)
    elif re.search(r"^\s*[A-Za-z_]\w* \.{2,} ", text, re.M):
        view = ConfigView()
        parse_args_dump(lines_of(text, path), view)
        for key, item in list(view.values.items()):
            view.set(key, item.value, f"file:{name}")
    else:
        from diagnose.explain.config.safe_yaml import safe_load

        data = safe_load(text, what=name, strict_keys=True)
        if not looks_like_bridge(data):
            hint = (": it holds KEY=VALUE overrides only; pass the job's config (run_config.yaml, a recipe dump) as "
                    "CONFIG and each override with --set KEY=VALUE"
                    if _overrides_only(text) else "")
            raise DiagnoseError(f"{name} is not a Megatron-Bridge config (no model:/ddp:/checkpoint: sections), an "
                                f"arguments dump or a log{hint}")
        keycheck.check_bridge_mapping(data, name)
        view = flatten_bridge(data, f"file:{name}")
        keycheck.check_values({k: v.value for k, v in view.values.items()}, name)
        view.framework = "megatron-bridge"
    view.sources.append(f"file:{name}")
    _finish(view, [], defaults)
    return view


_BRIDGE_OVERRIDE = re.compile(r"[A-Za-z_]\w*(?:\.\w+)+=")


def _refuse_bridge_overrides(tokens: list[str], name: str) -> None:
    """A Megatron-Bridge override (``model.num_layers=4``) among Megatron-LM flags was skipped without a word, so
    ``check`` validated and planned the config without it; say where it belongs instead."""
    found = [t for t in tokens if _BRIDGE_OVERRIDE.match(t)]
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        shown = repr(found[0][:80])
        raise DiagnoseError(f"{name}: {shown}{more} is a Megatron-Bridge override in a Megatron-LM argument list, "
                            f"which would ignore it: pass it with --set {shown}, or write it as a flag")


def resolve_config_path(path: str) -> str:
    """A checkpoint folder means its run_config.yaml: ``iter_0000500/`` directly, or the save root (the
    iteration in ``latest_checkpointed_iteration.txt``, else the highest ``iter_*``)."""
    if not os.path.isdir(path):
        return path
    direct = os.path.join(path, "run_config.yaml")
    if os.path.isfile(direct):
        return direct
    try:
        iters = sorted(d for d in os.listdir(path) if re.fullmatch(r"iter_\d+", d))
    except OSError as e:
        raise DiagnoseError(f"cannot list {path}: {e.strerror or e}") from None
    tracker = os.path.join(path, "latest_checkpointed_iteration.txt")
    try:
        with open(tracker, encoding="utf-8", errors="replace") as fh:
            it = fh.read(64).strip()
        if it.isdigit() and f"iter_{int(it):07d}" in iters:
            iters.append(f"iter_{int(it):07d}")  # the tracker's iteration wins
    except OSError:
        pass
    for d in reversed(iters):
        candidate = os.path.join(path, d, "run_config.yaml")
        if os.path.isfile(candidate):
            return candidate
    raise DiagnoseError(f"no run_config.yaml in {path} (expected a checkpoint iter_* folder or its save root)")


def _read(path: str) -> str:
    """The config file's text, bounded. A device is refused (``check /dev/zero`` read until it held 24 GB) and a
    FIFO read with a deadline (``check FIFO`` with no writer waited forever); ``<(...)`` still works. ``-`` is
    standard input (``cat run_config.yaml | diagnose check - --gpus 8``), as for ``analyze -``."""
    if path == "-":
        return _decode(_read_stdin())
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) or stat.S_ISSOCK(st.st_mode):
            raise DiagnoseError(f"config {path}: a device or socket, not a config file")
        if st.st_size > MAX_CONFIG_FILE_BYTES:
            raise DiagnoseError(f"config {path} is too large ({st.st_size} bytes)")
        if stat.S_ISFIFO(st.st_mode):
            data = _read_pipe(path)
        else:
            with open(path, "rb") as fh:
                data = fh.read(MAX_CONFIG_FILE_BYTES + 1)
    except FileNotFoundError:
        raise DiagnoseError(f"config file not found: {path}") from None
    except IsADirectoryError:
        raise DiagnoseError(f"config path is a directory, expected a file: {path}") from None
    except PermissionError:
        raise DiagnoseError(f"permission denied reading config: {path}") from None
    except OSError as e:
        raise DiagnoseError(f"cannot read config {path}: {e.strerror or e}") from None
    if len(data) > MAX_CONFIG_FILE_BYTES:
        raise DiagnoseError(f"config {path} is too large (more than {MAX_CONFIG_FILE_BYTES} bytes)")
    return _decode(data)


def _read_stdin() -> bytes:
    """Standard input to its end, bounded; a terminal is refused (nothing would say what is awaited)."""
    import sys

    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:
        raise DiagnoseError("config -: standard input is closed")
    try:
        if stream.isatty():
            raise DiagnoseError("config -: standard input is a terminal: pipe the config in "
                                "(cat run_config.yaml | diagnose check - --gpus N)")
        data = stream.read(MAX_CONFIG_FILE_BYTES + 1)
    except (OSError, ValueError) as e:
        raise DiagnoseError(f"cannot read the config from standard input: {getattr(e, 'strerror', None) or e}") \
            from None
    if len(data) > MAX_CONFIG_FILE_BYTES:
        raise DiagnoseError(f"config - is too large (more than {MAX_CONFIG_FILE_BYTES} bytes)")
    if not data.strip():
        raise DiagnoseError("config -: standard input is empty")
    return data


def _decode(data: bytes) -> str:
    """UTF-8, or UTF-16/32 when a BOM or the NUL pattern says so (a config saved by Notepad as "Unicode" or written
    by PowerShell's ``>`` was refused as "not valid YAML: special characters are not allowed"), as logs are read."""
    from diagnose.ingest import sniff

    sample = data[: sniff.SAMPLE_BYTES]
    encoding = sniff.bom_encoding(sample) or sniff.bomless_utf16(sample)
    if encoding is None:
        return data.decode("utf-8", errors="replace")
    bom = next((len(b) for b, enc in sniff.BOMS if enc == encoding and data.startswith(b)), 0)
    return data[bom:].decode(encoding, errors="replace")


PIPE_FIRST_DATA_S = 10.0  # as ingest waits for a FIFO's writer
PIPE_QUIET_S = 60.0  # once data came, a writer this quiet has said all it will


def _read_pipe(path: str) -> bytes:
    """A FIFO to its end (``diagnose check <(ssh host cat run_config.yaml)``), at most the size limit plus a byte;
    one line when no writer shows up."""
    import select

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a plain open blocks until a writer opens the other end
    try:
        os.set_blocking(fd, True)
        data = bytearray()
        while len(data) <= MAX_CONFIG_FILE_BYTES:
            ready, _, _ = select.select([fd], [], [], PIPE_QUIET_S if data else PIPE_FIRST_DATA_S)
            if not ready:
                if not data:
                    raise DiagnoseError(f"config {path} (a FIFO): nothing to read after {PIPE_FIRST_DATA_S:.0f} s "
                                        "(no writer?)")
                break
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            data += chunk
        return bytes(data)
    finally:
        os.close(fd)


def looks_like_log_file(path: str) -> bool:
    """A log (scan it with the engine) rather than a config file: judged from its first 1 MiB."""
    path = resolve_config_path(path)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False  # a pipe read here would be empty for load_config; a FIFO or a device would block or never end
        with open(path, "rb") as fh:
            head = _decode(fh.read(1024 * 1024))
    except OSError:
        return False  # load_config reports the problem
    return _looks_like_log(head)


def _looks_like_log(text: str) -> bool:
    """A config banner anywhere, or a launcher / traceback / rank line in the first 200,000 characters."""
    if any(m in text for m in (C.SUMMARY_TITLE, C.TASK_CONFIG_BANNER, C.MLM_ARGS_BANNER)):
        return True
    return bool(re.search(r"(torchrun|Traceback \(most recent call last\)|\[rank\d+\]:|using world size:|"
                          r"number of parameters on)", text[:200_000]))


def lines_of(text: str, path: str) -> list[LogLine]:
    return [normalize_line(raw, path, i) for i, raw in enumerate(text.splitlines(), 1)]


def blocks_from_lines(lines: list[LogLine]) -> dict[str, list[Block]]:
    """Collect CAPTURES blocks from lines (one stream), for files read without the engine."""
    out: dict[str, list[Block]] = {}
    for spec in C.CAPTURES:
        rx = re.compile(spec.regex) if spec.regex else None
        found: list[Block] = []
        for i, line in enumerate(lines):
            if spec.anchor not in line.text or (rx is not None and not rx.search(line.text)):
                continue
            taken = [line]
            for nxt in lines[i + 1: i + 1 + spec.lines_after]:
                taken.append(nxt)
                if spec.until and spec.until in nxt.text:
                    break
            found.append(Block(spec.name, line.path, line.lineno, taken))
        if not found:
            continue
        if spec.keep == "first":
            found = found[:1]
        elif spec.keep == "last":
            found = found[-1:]
        elif spec.keep == "first_last":
            found = [found[0]] + ([found[-1]] if len(found) > 1 else [])
        out[spec.name] = found[: spec.max_blocks]
    return out


_OVERRIDE_LINE = re.compile(r"^\s*[+~]?[A-Za-z_][\w.]*=\S")


def _overrides_only(text: str) -> bool:
    """Every line that is not blank or a comment is a Hydra-style ``key=value`` override (Bridge's CLI form)."""
    lines = [ln for ln in text.splitlines()[:2000] if ln.strip() and not ln.lstrip().startswith("#")]
    return bool(lines) and all(_OVERRIDE_LINE.match(ln) for ln in lines)
