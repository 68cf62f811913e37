"""Where a refused name came from (diagnose/match/inference.py: refused_name, name_written_by_other_package) and the
tables that read it (IF370, IF117's module-attribute exclusion, CV220's subcommands): synthetic tracebacks."""

from __future__ import annotations

import pytest

from diagnose.match import load_catalogue, match_text
from diagnose.match.command_line import pinned_release
from diagnose.match.inference import infer, name_written_by_other_package, refused_name

CATALOGUE = load_catalogue()
SITE = "/env/lib/python3.11/site-packages"


def frame(path: str, func: str, code: str = "") -> str:
    head = f'File "{path}", line 10, in {func}'
    return f"{head} {code}" if code else head


@pytest.mark.parametrize(("line", "name"), [
    ("TypeError: f() got an unexpected keyword argument 'use_cache'", "use_cache"),
    ("ValueError: BuilderConfig BuilderConfig(name='x') doesn't have a 'trust_remote_code' key.", "trust_remote_code"),
    ("KeyError: 'rope_scaling'", "rope_scaling"),
    ("ValueError: Unknown argument 'foo_bar'", "foo_bar"),
    ("KeyError: 'lm_head.weight'", ""),  # a module path, not a name someone typed
    ("KeyError: 'id'", ""),  # too short to say who wrote it
    ("ValueError: lr must be positive", ""),
])
def test_refused_name(line, name):
    assert refused_name(line) == name


def test_a_name_written_by_the_calling_package_is_found():
    frames = [
        frame("/home/u/run.py", "main", "ds = Wrapper()"),
        frame(f"{SITE}/wrapperlib/data.py", "__init__", "load_thing('x', use_fast_path=True)"),
        frame(f"{SITE}/thinglib/core.py", "load_thing", "raise ValueError(msg)"),
    ]
    line = "ValueError: Config doesn't have a 'use_fast_path' key."
    assert name_written_by_other_package(line, frames) == "wrapperlib"
    got = infer(CATALOGUE.inferences, "PY001", line, frames, "unknown")
    assert got is not None and got.inference.code == "IF370" and got.inference.category == "import_version"
    assert "wrapperlib" in got.basis and "thinglib" in got.basis


@pytest.mark.parametrize("frames", [
    # the user's script wrote it: not another package's release
    [frame("/home/u/run.py", "main", "load_thing('x', use_fast_path=True)"),
     frame(f"{SITE}/thinglib/core.py", "load_thing", "raise ValueError(msg)")],
    # the same package wrote it (forwarded inside one release)
    [frame(f"{SITE}/thinglib/api.py", "load", "return load_thing('x', use_fast_path=True)"),
     frame(f"{SITE}/thinglib/core.py", "load_thing", "raise ValueError(msg)")],
    # another package calls, but does not write the name (it forwards **kwargs it was given)
    [frame(f"{SITE}/wrapperlib/data.py", "__init__", "load_thing('x', **kwargs)"),
     frame(f"{SITE}/thinglib/core.py", "load_thing", "raise ValueError(msg)")],
    # the name only as a longer identifier or a comparison
    [frame(f"{SITE}/wrapperlib/data.py", "__init__", "if my_use_fast_path == use_fast_path2: load_thing('x')"),
     frame(f"{SITE}/thinglib/core.py", "load_thing", "raise ValueError(msg)")],
])
def test_no_other_package_wrote_the_name(frames):
    line = "ValueError: Config doesn't have a 'use_fast_path' key."
    assert name_written_by_other_package(line, frames) == ""
    got = infer(CATALOGUE.inferences, "PY001", line, frames, "unknown")
    assert got is None or got.inference.code != "IF370"


def test_a_module_attribute_a_config_names_is_the_release_unless_python_suggests_a_near_name():
    loader = [frame("/opt/App/app/components/config/loader.py", "resolve_target", "return getattr(module, parts[-1])")]
    skew = infer(CATALOGUE.inferences, "PY001", "AttributeError: module 'app.models.common' has no attribute 'BackendConfig'",
                 loader, "unknown")
    assert skew is not None and skew.inference.category == "import_version"
    typo = infer(CATALOGUE.inferences, "PY001",
                 "AttributeError: module 'torch.optim' has no attribute 'AdamWW'. Did you mean: 'AdamW'?", loader, "unknown")
    assert typo is not None and typo.inference.category == "config_validation"


@pytest.mark.parametrize(("text", "code"), [
    ("usage: tool.py [-h] {fit,test} ...\ntool.py: error: argument {fit,test}: invalid choice: 'export' (choose from 'fit', 'test')", "CV220"),
    ("tool: error: argument {fit,test}: invalid choice: 'tesst' (choose from 'fit', 'test')", None),  # a typo
])
def test_an_unknown_subcommand_is_another_release_of_the_program(text, code):
    report = match_text(text, CATALOGUE)
    codes = [f.rule for f in report.findings]
    if code:
        assert report.root is not None and report.root.rule == code and report.root.category == "import_version"
    else:
        assert "CV220" not in codes


@pytest.mark.parametrize(("log", "pinned"), [
    ("$ docker run --gpus all -v /data/hf:/root/.cache -p 8000:8000 vllm/vllm-openai:v0.8.5 --model m --reasoning-parser qwen3\n"
     "usage: api_server.py [--reasoning-parser {deepseek_r1,granite}]\n", "vllm/vllm-openai:v0.8.5"),
    ("srun --container-image=nvcr.io/nvidia/pytorch:24.01-py3 python train.py --optim=lion\n", "nvcr.io/nvidia/pytorch:24.01-py3"),
    ("$ uvx --from vllm==0.8.5 python -m vllm.entrypoints.openai.api_server --reasoning-parser qwen3\n", "vllm==0.8.5"),
    # no image pinned to a release: a tag that is no version, a port mapping, a volume
    ("$ docker run -p 8000:8000 -v /a:/b vllm/vllm-openai:latest --model m --reasoning-parser qwen3\n", ""),
    # the option only in the usage text or another option that contains it: no command line typed it
    ("usage: api_server.py [--reasoning-parser {deepseek_r1,granite}]\n", ""),
    ("$ docker run org/img:1.2.3 --reasoning-parser-plugin x\n", ""),
])
def test_pinned_release_on_the_command_line_that_typed_the_option(log, pinned):
    buf = log.encode()
    assert pinned_release(buf, len(buf), "--reasoning-parser" if "reasoning" in log else "--optim", {}) == pinned


def test_pinned_release_memo_gives_the_answer_of_a_fresh_search():
    first = b"$ docker run org/tool:v1.0 --mode fast\nerror one\n"
    second = b"$ docker run org/tool:latest --mode fast\nerror two\n"
    buf = first + second
    memo: dict = {}
    assert pinned_release(buf, len(first), "--mode", memo) == "org/tool:v1.0"
    assert pinned_release(buf, len(buf), "--mode", memo) == ""  # the newer command runs no pinned release
    assert pinned_release(buf, len(buf), "--mode", {}) == ""


def test_a_framework_checkout_counts_as_a_package():
    frames = [
        frame("/workspace/Megatron-LM/megatron/core/transformer/attention.py", "forward",
              "out = te_attention(q, k, v, window_size=self.window)"),
        frame(f"{SITE}/transformer_engine/pytorch/attention.py", "forward", "raise KeyError(name)"),
    ]
    assert name_written_by_other_package("KeyError: 'window_size'", frames) == "megatron"
    # two files of one checkout are one package
    same = [frame("/opt/Megatron-Bridge/src/megatron/bridge/data/builders/x.py", "build", "make(window_size=3)"),
            frame("/opt/Megatron-Bridge/src/megatron/bridge/data/datasets/y.py", "make", "raise KeyError(k)")]
    assert name_written_by_other_package("KeyError: 'window_size'", same) == ""


# The refusal wordings are written twice: inference._REFUSED_NAME (which name a refusal names, for IF370 and
# refused_unlike_listed) and IF261's text_any (a refusal by a package whose release the log names). They cannot be
# one list without changing what either reads, so every wording of either side has a witness line here, with the
# sides that read it; a wording added to one side only fails below until its witness says so.
BOTH, NAME_ONLY, TABLE_ONLY = "both", "refused_name only", "IF261 only"
REFUSAL_WITNESSES = [
    ("TypeError: f() got an unexpected keyword argument 'use_cache'", BOTH),
    ("ValueError: BuilderConfig(name='x') doesn't have a 'trust_remote_code' key.", BOTH),
    ("ValueError: Unknown argument 'foo_bar'", BOTH),
    ("ValueError: unrecognized key 'foo_bar'", BOTH),
    # a field or an attribute that a config class does not have; IF261 reads only a missing key
    ("ValueError: KernelConfig doesn't have a 'use_fast_path' field.", NAME_ONLY),
    ("ValueError: KernelConfig has no option 'use_fast_path'", NAME_ONLY),
    # a bare KeyError names the key but not who refused it
    ("KeyError: 'rope_scaling'", NAME_ONLY),
    ("ValueError: unsupported option 'fast_mode'", NAME_ONLY),
    # IF261 also reads refusals that name no single refused key: an attribute, a value, a model name
    ("AttributeError: 'Config' object has no attribute 'use_fp8'", TABLE_ONLY),
    ("ValueError: 'llama9' is not a valid ModelType", TABLE_ONLY),
    ("ValueError: Unknown model 'llama9'", TABLE_ONLY),
]


def _top_level_alternatives(pattern: str) -> list[str]:
    """A regex's alternatives at depth 0 (escapes and character classes skipped)."""
    parts, depth, start, i, in_class = [], 0, 0, 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
        i += 1
    return [*parts, pattern[start:]]


def test_every_refusal_wording_is_read_by_both_or_says_which_side():
    import regex

    from diagnose.match.inference import _REFUSED_NAME

    names = [regex.compile(a) for a in _top_level_alternatives(_REFUSED_NAME.pattern)]
    table = [regex.compile(t) for t in next(i for i in CATALOGUE.inferences if i.code == "IF261").text_any]
    assert len(names) >= 5 and len(table) >= 6
    for side, wordings in (("refused_name", names), ("IF261", table)):
        for w in wordings:
            assert any(w.search(line) for line, _ in REFUSAL_WITNESSES), f"{side} wording {w.pattern!r}: no witness"
    for line, sides in REFUSAL_WITNESSES:
        by_name, by_table = bool(_REFUSED_NAME.search(line)), any(t.search(line) for t in table)
        got = BOTH if by_name and by_table else NAME_ONLY if by_name else TABLE_ONLY if by_table else "neither"
        assert got == sides, line
