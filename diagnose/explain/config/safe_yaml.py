"""Safe YAML for configs from users and logs.

A ``yaml.SafeLoader`` subclass that (1) never constructs Python objects: any tag it does not know
(``!!python/object/apply:os.system``, custom ``!foo``) is loaded as the plain data under it, inert, and remembered:
a config a user hands us (``strict_keys``) is then refused in one line naming the key and the tag, as Bridge's
``yaml.safe_load`` would refuse it, while a log's YAML stays silent; (2) refuses alias bombs (billion laughs) by
counting alias uses; (3) refuses documents over a size limit. Failures are a one-line ``DiagnoseError``.

When PyYAML has libyaml, a document is parsed in C (a 10 MB config: 14 s in the pure-Python parser): its events
are counted first, one at a time and never kept, with the same limits (aliases, nodes) and a depth bound, then it
is composed in C and constructed by the same inert constructor. Anything the C path cannot answer for itself (an
error, deep nesting) goes to the pure-Python loader, whose answer and words are the reference.
"""

from __future__ import annotations

import re
import sys
from typing import Any, cast

import yaml

from diagnose.model import DiagnoseError

MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
MAX_ALIASES = 256
MAX_NODES = 500_000
MAX_EXPANDED = 1_000_000  # values after alias expansion (what flattening or printing would walk)
MAX_EXPANDED_CHARS = 2 * MAX_DOCUMENT_BYTES  # scalar text after alias expansion (what printing would write)


def _too_many_aliases() -> DiagnoseError:
    return DiagnoseError(f"YAML refused: more than {MAX_ALIASES} aliases (an alias bomb?)")


def _too_many_nodes() -> DiagnoseError:
    return DiagnoseError(f"YAML refused: more than {MAX_NODES} nodes")


class _StrictKeys:
    """Refuse a key given twice in one mapping when ``strict_keys`` (Bridge's loader does; PyYAML keeps the
    last): shared by the pure-Python and the libyaml loader."""

    strict_keys = False
    unhonoured: list[yaml.Node]  # the nodes whose tag was loaded inert (set per document by _load)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:  # noqa: D102 - duplicate check only
        if self.strict_keys and isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    line = key_node.start_mark.line + 1
                    if key_node.value in seen:
                        raise DiagnoseError(
                            f"duplicate key '{_short(key_node.value)}' at line {line} (first at line "
                            f"{seen[key_node.value]}): the second would replace the first"
                        )
                    seen[key_node.value] = line
        return super().construct_mapping(node, deep=deep)  # type: ignore[misc]


class InertSafeLoader(_StrictKeys, yaml.SafeLoader):
    """SafeLoader that loads unknown tags as plain data and limits aliases and nodes."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: D102 - counting only
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _too_many_aliases()
        else:
            self._nodes += 1
            if self._nodes > MAX_NODES:
                raise _too_many_nodes()
        return super().compose_node(parent, index)


_CLoader: Any = getattr(yaml, "CSafeLoader", None)  # None: PyYAML built without libyaml
MAX_C_DEPTH = 100  # deeper documents go to the pure-Python loader (its RecursionError is the refusal)

InertCSafeLoader: Any = None  # libyaml's loader with the inert constructors, when PyYAML has libyaml
if _CLoader is not None:
    class _InertCSafeLoader(_StrictKeys, _CLoader):
        """libyaml's parser and composer, with InertSafeLoader's constructors (inert tags, strict keys)."""

    InertCSafeLoader = _InertCSafeLoader


def _construct_inert(loader: InertSafeLoader, tag_suffix: str, node: yaml.Node) -> Any:
    """Unknown tag: keep the data, remember the node (``loader.unhonoured``), never import or call what it names."""
    loader.unhonoured.append(node)
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(cast(yaml.ScalarNode, node))


for _loader in (InertSafeLoader, InertCSafeLoader):
    if _loader is not None:
        _loader.add_multi_constructor("", _construct_inert)
        _loader.add_multi_constructor("tag:yaml.org,2002:python/", _construct_inert)


def _short(text: str, limit: int = 60) -> str:
    text = "".join(ch if ch.isprintable() else "?" for ch in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def safe_load(text: str, what: str = "YAML", strict_keys: bool = False) -> Any:
    """Parse one YAML document safely; DiagnoseError (one line) on bad or hostile input. ``strict_keys``: a key
    repeated in one mapping is an error (config files a user hands us), not "the last one wins"."""
    if len(text) > MAX_DOCUMENT_BYTES:
        raise DiagnoseError(f"{what} refused: larger than {MAX_DOCUMENT_BYTES // (1024 * 1024)} MiB")
    as_json = _json_document(text)
    if as_json is not _NOT_JSON:
        return as_json
    as_c = _c_document(text, what, strict_keys)
    if as_c is not _NOT_C:
        return as_c
    return _load(InertSafeLoader, text, what, strict_keys)


def _load(loader_class: Any, text: str, what: str, strict_keys: bool) -> Any:
    """Compose, check the alias expansion, construct; every failure one DiagnoseError."""
    loader: Any = None
    try:
        loader = loader_class(text)
        loader.strict_keys = strict_keys
        loader.unhonoured = []
        node = loader.get_single_node()
        if node is None:
            return None
        nodes, chars = _expanded(node)
        if nodes > MAX_EXPANDED:
            raise DiagnoseError(f"{what} refused: aliases expand to more than {MAX_EXPANDED} values (an alias bomb?)")
        if chars > MAX_EXPANDED_CHARS:
            raise DiagnoseError(f"{what} refused: aliases expand to more than {MAX_EXPANDED_CHARS // (1 << 20)} MiB "
                                "of text (an alias bomb?)")
        data = loader.construct_document(node)
        if strict_keys and loader.unhonoured:
            raise DiagnoseError(_unhonoured_tag(what, node, loader.unhonoured))
        return data
    except DiagnoseError as e:
        if strict_keys and str(e).startswith("duplicate key"):
            raise DiagnoseError(f"{what}: {e}") from None
        raise
    except yaml.YAMLError as e:
        raise _not_valid(what, e) from None
    except RecursionError:
        raise DiagnoseError(f"{what} refused: nested too deeply") from None
    except ValueError as e:  # a scalar its constructor cannot build: int() of 5000 digits, a 13th month
        raise DiagnoseError(_bad_value(what, text, e)) from None
    finally:
        if loader is not None:
            loader.dispose()


def _unhonoured_tag(what: str, root: yaml.Node, tagged: list[yaml.Node]) -> str:
    """The one line for a config whose value carries a tag no safe loader knows: which key, which tag, where."""
    node = tagged[0]
    tag = str(node.tag)
    shown = "!!" + tag[len("tag:yaml.org,2002:"):] if tag.startswith("tag:yaml.org,2002:") else tag
    key = _key_path(root, node)
    more = f" (and {len(tagged) - 1} more)" if len(tagged) > 1 else ""
    return (f"{what}: {_short(key) if key else 'the document'}: YAML tag '{_short(shown)}' at line "
            f"{node.start_mark.line + 1}{more} is not honoured (read as plain data, nothing it names is run); "
            "Megatron-Bridge's loader (yaml.safe_load) would refuse it")


def _key_path(root: yaml.Node, target: yaml.Node) -> str:
    """The dotted key (``model.num_layers``, ``data.blend[2]``) at which ``target`` sits in ``root``; each node
    walked once."""
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if node is target:
            return path
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key, value in reversed(node.value):
                name = key.value if isinstance(key, yaml.ScalarNode) else "?"
                here = f"{path}.{name}" if path else str(name)
                stack.extend(((value, here), (key, here)))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, f"{path}[{i}]") for i, item in reversed(list(enumerate(node.value))))
    return ""


def _not_valid(what: str, e: yaml.YAMLError) -> DiagnoseError:
    """A syntax error, in one line: where and what (either parser's words)."""
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}" if mark is not None else ""
    problem = getattr(e, "problem", None) or getattr(e, "reason", None) or type(e).__name__
    problem = " ".join(str(problem).split())
    return DiagnoseError(f"{what} is not valid YAML{where}: {problem}")


_NOT_JSON = object()
_NOT_C = object()
# Above this size a syntax error found by libyaml is worded by libyaml: the pure-Python parser words it as it always
# has, but takes ~1.4 s per MB to reach it (10 MB with an error on its last line: 14 s)
PURE_WORDING_MAX_BYTES = 256 * 1024
_NODE_EVENTS = (yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent)
_END_EVENTS = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def _c_document(text: str, what: str, strict_keys: bool) -> Any:
    """The document parsed by libyaml, or ``_NOT_C`` for the pure-Python loader to answer (no libyaml, an error of
    any kind, nesting deeper than MAX_C_DEPTH). The C composer builds the whole node graph before Python sees it,
    so the composer's limits are applied first on libyaml's events, which are made one at a time and dropped:
    refused with the pure path's words, before any graph exists."""
    if InertCSafeLoader is None:
        return _NOT_C
    counter = _CLoader(text)
    aliases = nodes = depth = 0
    try:
        while True:
            event = counter.get_event()
            if event is None or isinstance(event, yaml.StreamEndEvent):
                break
            if isinstance(event, yaml.AliasEvent):
                aliases += 1
                if aliases > MAX_ALIASES:
                    raise _too_many_aliases()
            elif isinstance(event, _NODE_EVENTS):
                nodes += 1
                if nodes > MAX_NODES:
                    raise _too_many_nodes()
                if not isinstance(event, yaml.ScalarEvent):
                    depth += 1
                    if depth > MAX_C_DEPTH:
                        return _NOT_C
            elif isinstance(event, _END_EVENTS):
                depth -= 1
    except yaml.YAMLError as e:
        if len(text) > PURE_WORDING_MAX_BYTES:
            raise _not_valid(what, e) from None
        return _NOT_C  # the pure-Python loader words the error (line, problem) as it always has
    finally:
        counter.dispose()
    try:
        return _load(InertCSafeLoader, text, what, strict_keys)
    except DiagnoseError as e:
        if "not valid YAML" in str(e) and len(text) <= PURE_WORDING_MAX_BYTES:
            return _NOT_C  # a composer's error (an undefined alias): worded by the pure loader, as above
        raise


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _DuplicateKey
    return out


def _refuse_constant(name: str) -> Any:
    raise ValueError(name)  # NaN, Infinity: not JSON, and YAML reads them as strings


def _json_document(text: str) -> Any:
    """A config written as JSON (a JSON document is YAML too), parsed by the C JSON parser: PyYAML's pure-Python
    one took 30 s and 440 MiB for a 6.7 MB JSON config (a long dataset blend list), 29 s to refuse a 9 MB one.
    ``_NOT_JSON`` when it is not plain JSON, or when the YAML path must speak (a key given twice: its line; an
    integer of 5000 digits: its message; too deep): the answer is then the YAML loader's."""
    start = text.lstrip()[:1]
    if start not in ("{", "["):
        return _NOT_JSON
    import json

    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_refuse_constant)
    except (ValueError, _DuplicateKey, RecursionError):
        return _NOT_JSON
    if _count_nodes(data) > MAX_NODES:
        raise _too_many_nodes()  # the YAML path's words, 30 s sooner
    return data


def _count_nodes(data: Any) -> int:
    """Values in a parsed JSON tree (keys included, as YAML's composer counts them), stopping past MAX_NODES."""
    count, stack = 0, [data]
    while stack and count <= MAX_NODES:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            count += len(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


def _bad_value(what: str, text: str, error: ValueError) -> str:
    """The one line for a value PyYAML's constructors raise ValueError on (the error carries no line): CPython's
    int() refuses more than ``sys.get_int_max_str_digits()`` digits (4300), ``datetime`` a 13th month."""
    limit = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 4300
    long_int = re.search(rf"\d{{{limit + 1}}}", text) if limit else None
    if long_int is not None:
        line = text.count("\n", 0, long_int.start()) + 1
        return f"{what} refused at line {line}: an integer of more than {limit} digits"
    return f"{what} is not valid YAML: {_short(str(error), 120)}"


def _expanded(root: yaml.Node) -> tuple[int, int]:
    """(nodes, characters of scalar text) once every alias is expanded, capped just above the limits: one 4 MiB
    anchored string used 250 times is a few nodes but a gigabyte of output (issue 19)."""
    sizes: dict[int, tuple[int, int]] = {}
    too_big = (MAX_EXPANDED + 1, MAX_EXPANDED_CHARS + 1)

    def size(node: yaml.Node) -> tuple[int, int]:
        key = id(node)
        if key not in sizes:
            sizes[key] = too_big  # a cycle counts as too big
            nodes, chars = 1, len(node.value) if isinstance(node, yaml.ScalarNode) else 0
            for child in _children(node):
                n, c = size(child)
                nodes, chars = nodes + n, chars + c
                if nodes > MAX_EXPANDED or chars > MAX_EXPANDED_CHARS:
                    break
            sizes[key] = (min(nodes, too_big[0]), min(chars, too_big[1]))
        return sizes[key]

    return size(root)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []
