"""megatron-core's custom pipeline layout (``pipeline_model_parallel_layout``), read without evaluating anything.

The setting (Bridge ``model.pipeline_model_parallel_layout``, Megatron-LM ``--pipeline-model-parallel-layout``)
lists what every (virtual) pipeline stage builds: ``E`` the embedding, ``t`` a transformer decoder layer, ``m`` an
MTP layer, ``L`` the loss (output layer). Stages are separated by ``|`` and listed in *virtual* order: with
``PP`` pipeline ranks and ``n`` stages, ``VPP = n / PP`` and stage ``k`` is virtual chunk ``k // PP`` of pipeline
rank ``k % PP`` (megatron-core ``pipeline_parallel_layer_layout.py``, ``PipelineParallelLayerLayout.__init__``).
``x*n`` repeats one symbol (a layer or a ``|``), ``(...)*n`` repeats a group, ``,`` is cosmetic and ignored, e.g.
DeepSeek-V3 at PP=16, VPP=2: ``"Et*3|(tt|)*29,m|L"``. A list of lists of layer names (``"embedding"``,
``"decoder"``, ``"mtp"``, ``"loss"``, case and surrounding spaces ignored) is the same thing, one list per stage,
and is what Bridge's recipes set.

Upstream expands the string with regular-expression substitution (groups first, then single symbols); groups do
not nest there, so a nested group is refused here. Here a small grammar is parsed instead, with bounds so a
hostile value cannot make us build a huge string: at most ``MAX_INPUT`` characters, repetition counts of at most
``MAX_REPEAT``, at most ``MAX_EXPANDED`` symbols after expansion (checked before expanding).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from diagnose.model import DiagnoseError

MAX_INPUT = 4096  # characters of the layout string (or names in the list form)
MAX_REPEAT = 10_000  # largest n in x*n or (...)*n
MAX_EXPANDED = 100_000  # symbols (layers and separators) after expansion

SYMBOLS = {"E": "embedding", "t": "decoder", "m": "mtp", "L": "loss"}
_NAMES = {name: sym for sym, name in SYMBOLS.items()}


class LayoutError(DiagnoseError):
    """A ``pipeline_model_parallel_layout`` value that cannot be read (one line, says what and where)."""


def _snippet(text: str, at: int) -> str:
    """Where the parser stopped (in the text without its commas), shown with ``repr`` so that control characters
    from a config cannot reach a terminal."""
    return f"near {text[max(0, at - 8):at + 8]!r}"


@dataclass
class _Parser:
    text: str
    pos: int = 0

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def fail(self, why: str) -> LayoutError:
        return LayoutError(f"pipeline_model_parallel_layout: {why} {_snippet(self.text, self.pos)}")

    def count(self) -> int | None:
        """``*n`` after an item, or None when no ``*`` follows."""
        if self.peek() != "*":
            return None
        self.pos += 1
        start = self.pos
        while self.peek().isdigit() and self.peek().isascii():
            self.pos += 1
            if self.pos - start > len(str(MAX_REPEAT)):
                raise self.fail(f"repetition count larger than {MAX_REPEAT}")
        if self.pos == start:
            raise self.fail("'*' must be followed by a whole number")
        n = int(self.text[start:self.pos])
        if n > MAX_REPEAT:
            raise self.fail(f"repetition count {n} is larger than {MAX_REPEAT}")
        if self.peek() == "*":
            raise self.fail("a repetition cannot be repeated again")
        return n

    def items(self, depth: int) -> str:
        """A sequence of symbols and groups, expanded; stops at ')' or the end."""
        out: list[str] = []
        size = 0
        while self.pos < len(self.text) and self.peek() != ")":
            ch = self.peek()
            if ch == "(":
                if depth > 0:
                    raise self.fail("nested parentheses are not supported (megatron-core does not expand them)")
                self.pos += 1
                body = self.items(depth + 1)
                if self.peek() != ")":
                    raise self.fail("'(' without a matching ')'")
                if not body:
                    raise self.fail("empty group '()'")
                self.pos += 1
                n = self.count()
                if n is None:
                    raise self.fail("a group '( ... )' must be followed by '*n'")
            elif ch in SYMBOLS or ch == "|":
                self.pos += 1
                body = ch
                n = self.count()
                n = 1 if n is None else n
            else:
                raise self.fail(f"unknown layer symbol {ch!r} (known: E embedding, t decoder, m mtp, L loss, "
                                f"'|' between stages)")
            size += len(body) * n
            if size > MAX_EXPANDED:
                raise self.fail(f"expands to more than {MAX_EXPANDED} layers and separators")
            out.append(body * n)
        return "".join(out)


def _parse_str(text: str) -> tuple[str, ...]:
    if len(text) > MAX_INPUT:
        raise LayoutError(f"pipeline_model_parallel_layout: {len(text)} characters, more than {MAX_INPUT}")
    parser = _Parser(text.replace(",", ""))  # commas are cosmetic (upstream removes them first)
    flat = parser.items(0)
    if parser.pos < len(parser.text):
        raise parser.fail("')' without a matching '('")
    return tuple(flat.split("|"))


def _parse_list(value: list | tuple) -> tuple[str, ...]:
    stages = []
    total = 0
    for i, row in enumerate(value):
        if not isinstance(row, (list, tuple)):
            raise LayoutError(f"pipeline_model_parallel_layout: stage {i} is a {type(row).__name__}, not a list "
                              "of layer names")
        symbols = []
        for name in row:
            total += 1
            if total > MAX_EXPANDED:
                raise LayoutError(f"pipeline_model_parallel_layout: more than {MAX_EXPANDED} layers")
            key = name.strip().lower() if isinstance(name, str) else None
            if key == "encoder":
                raise LayoutError("pipeline_model_parallel_layout: encoder layers are not supported by "
                                  "megatron-core's flexible pipeline layout")
            if key not in _NAMES:
                shown = repr(name)[:40]
                raise LayoutError(f"pipeline_model_parallel_layout: stage {i}: {shown} is not a layer name "
                                  f"(embedding, decoder, mtp, loss)")
            symbols.append(_NAMES[key])
        stages.append("".join(symbols))
    return tuple(stages)


# no two ways to match the same text (no catastrophic backtracking on a hostile value)
_LIST_TEXT = re.compile(r"\[\s*(?:\[[^\[\]]*\]\s*(?:,\s*)?)*\]")
_ROW = re.compile(r"\[([^\[\]]*)\]")


def _parse_list_text(text: str) -> tuple[str, ...]:
    """A list of lists written out as text (a config dump: ``[['embedding', 'decoder'], ['decoder', 'loss']]``),
    read with two regular expressions instead of evaluating it: rows of quoted names, nothing else."""
    if not _LIST_TEXT.fullmatch(text):
        raise LayoutError("pipeline_model_parallel_layout: a '[' value must be a list of lists of quoted layer "
                          "names")
    rows = []
    for body in _ROW.findall(text[1:-1]):
        names = [n.strip() for n in body.split(",") if n.strip()]
        if any(len(n) < 2 or n[0] not in "'\"" or n[-1] != n[0] for n in names):
            raise LayoutError("pipeline_model_parallel_layout: layer names in a written-out list must be quoted")
        rows.append([n[1:-1] for n in names])
    return _parse_list(rows)


def parse_layout(value: object) -> tuple[str, ...]:
    """The stages in virtual order, each a string of ``E``/``t``/``m``/``L``; raises ``LayoutError``."""
    if isinstance(value, str):
        if value.lstrip().startswith("["):
            if len(value) > MAX_INPUT * 8:
                raise LayoutError(f"pipeline_model_parallel_layout: {len(value)} characters, more than "
                                  f"{MAX_INPUT * 8}")
            return _parse_list_text(value.strip())
        return _parse_str(value)
    if isinstance(value, (list, tuple)):
        if len(value) > MAX_EXPANDED:
            raise LayoutError(f"pipeline_model_parallel_layout: more than {MAX_EXPANDED} stages")
        return _parse_list(value)
    raise LayoutError(f"pipeline_model_parallel_layout must be a string or a list of lists, not "
                      f"{type(value).__name__}")


def rank_chunks(stages: tuple[str, ...], pp: int) -> list[list[str]]:
    """Per pipeline rank, its virtual chunks in order (stage ``k`` is chunk ``k // pp`` of rank ``k % pp``)."""
    vpp = len(stages) // pp
    return [[stages[v * pp + r] for v in range(vpp)] for r in range(pp)]


def layout_problems(stages: tuple[str, ...], pp: int, num_layers: int, mtp_num_layers: int = 0,
                    vpp: int | None = None) -> list[str]:
    """Why megatron-core would refuse this layout for this model (empty: it accepts it).

    Mirrors ``PipelineParallelLayerLayout.__init__`` (stages divisible by PP), ``TransformerConfig`` (a configured
    VPP must equal the detected one) and ``validate_layer_layout`` (embedding first and once, loss last and once,
    decoder and MTP counts, decoder layers before MTP layers, MTP only in a rank's last virtual chunk and all in
    one chunk)."""
    pp = max(1, pp)
    if len(stages) % pp:
        return [f"{len(stages)} stages are not divisible by pipeline_model_parallel_size={pp}"]
    detected = len(stages) // pp
    problems = []
    if vpp is not None and vpp != detected and not (vpp <= 1 and detected == 1):
        problems.append(f"virtual_pipeline_model_parallel_size={vpp} conflicts with the layout's "
                        f"{len(stages)} stages / PP={pp} = {detected}")
    flat = "".join(stages)  # virtual order is layer order
    if not flat:
        return problems + ["the layout places no layers"]
    if flat[0] != "E":
        problems.append(f"the first layer must be the embedding (E), not {SYMBOLS[flat[0]]}")
    if flat[-1] != "L":
        problems.append(f"the last layer must be the loss (L), not {SYMBOLS[flat[-1]]}")
    if flat.count("E") != 1:
        problems.append(f"the embedding (E) must appear exactly once, not {flat.count('E')} times")
    if flat.count("L") != 1:
        problems.append(f"the loss (L) must appear exactly once, not {flat.count('L')} times")
    if flat.count("t") != num_layers:
        problems.append(f"{flat.count('t')} decoder layers (t) in the layout, but num_layers={num_layers}")
    mtp = mtp_num_layers or 0
    if flat.count("m") != mtp:
        problems.append(f"{flat.count('m')} MTP layers (m) in the layout, but mtp_num_layers={mtp}")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        problems.append("decoder layers (t) must all come before the MTP layers (m)")
    for r, chunks in enumerate(rank_chunks(stages, pp)):
        if any("m" in c for c in chunks[:-1]):
            problems.append(f"MTP layers must be in the last virtual stage of their rank (pipeline rank {r})")
        if "m" in chunks[-1] and chunks[-1].count("m") != mtp:
            problems.append(f"all MTP layers must be in one virtual stage (pipeline rank {r} has "
                            f"{chunks[-1].count('m')} of {mtp})")
    return problems


def rank_layer_ids(stages: tuple[str, ...], pp: int) -> list[list[int]]:
    """Decoder layer indices built by each pipeline rank: layers are numbered in virtual-stage order
    (``get_layer_offset``), so with VPP a rank's layers are not contiguous."""
    ids: list[list[int]] = [[] for _ in range(pp)]
    next_id = 0
    for k, stage in enumerate(stages):
        n = stage.count("t")
        ids[k % pp].extend(range(next_id, next_id + n))
        next_id += n
    return ids


def rank_mtp_layers(stages: tuple[str, ...], pp: int) -> list[int]:
    """MTP layers on each pipeline rank."""
    return [sum(c.count("m") for c in chunks) for chunks in rank_chunks(stages, pp)]


def describe(stages: tuple[str, ...], pp: int) -> str:
    """Decoder layers per pipeline rank, a rank's virtual chunks joined by ``+`` and equal neighbours merged:
    ``"rank 0: 3+2; ranks 1-13: 2+2; ranks 14-15: 2+0"``."""
    parts = ["+".join(str(c.count("t")) for c in chunks) for chunks in rank_chunks(stages, pp)]
    out, start = [], 0
    for r in range(1, len(parts) + 1):
        if r == len(parts) or parts[r] != parts[start]:
            out.append(f"rank {start}: {parts[start]}" if r - 1 == start else f"ranks {start}-{r - 1}: {parts[start]}")
            start = r
    return "; ".join(out)
