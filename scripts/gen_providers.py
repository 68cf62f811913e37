#!/usr/bin/env python3
"""Generate ``diagnose/explain/config/providers.json`` from Megatron-Bridge's model provider sources.

Usage: ``python3 scripts/gen_providers.py GIT_DIR [TAG ...]`` where GIT_DIR is a clone (or bare mirror) of
NVIDIA-NeMo/Megatron-Bridge. Nothing is imported or executed: each ``src/megatron/bridge/models/**/*provider*.py``
is read at each release tag (``git show TAG:PATH``) and parsed with ``ast``; the class-level defaults of every
dataclass that are literals (or simple list arithmetic such as ``[0] * 3 + [1] * 58``, module constants, a
callable such as ``F.silu`` kept by name) are recorded, with inheritance resolved inside that release.

Up to 0.3.x Bridge shipped one dataclass per model size (``Llama3ModelProvider8B``); later releases build the
provider from the Hugging Face config (``AutoBridge.from_hf_pretrained(...)``) and keep only family classes. Both
are covered: every class is recorded with the releases it was read from, grouped by identical defaults, so a
resolved value can say which release it came from. A provider whose docstring links a Hugging Face model is also
indexed by that model id (``hf_models``), for configs that name ``hf_model_id`` instead of a sized class.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys

DEFAULT_TAGS = ("v0.1.0rc4", "v0.2.0", "v0.2.2", "v0.3.0", "v0.3.1", "v0.4.2", "v0.5.0", "v0.6.0")
OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "diagnose", "explain", "config",
                   "providers.json")
_PATH = re.compile(r"^src/megatron/bridge/models/.*provider[^/]*\.py$")
_HF_LINK = re.compile(r"huggingface\.co/([\w.-]+/[\w.-]+)")
# megatron-core bases that change what a subclass builds (MLATransformerConfig turns MLA on)
# (megatron-core transformer_config.py MLATransformerConfig: the defaults it changes from TransformerConfig)
CORE_BASES = {"MLATransformerConfig": {
    "normalization": "RMSNorm", "multi_latent_attention": True, "q_lora_rank": 512, "kv_lora_rank": 512,
    "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128, "rope_type": "yarn"}}


class Unknown(Exception):
    """A default that is not a literal: left out of the table (the reader falls back and says so)."""


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True,
                          text=True).stdout


def evaluate(node: ast.AST, consts: dict[str, object]) -> object:
    """The value of a default expression made of literals, or raise Unknown."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [evaluate(e, consts) for e in node.elts]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = evaluate(node.operand, consts)
        if isinstance(value, (int, float)):
            return -value
    if isinstance(node, ast.BinOp):
        left, right = evaluate(node.left, consts), evaluate(node.right, consts)
        ops = {ast.Add: lambda a, b: a + b, ast.Mult: lambda a, b: a * b, ast.Sub: lambda a, b: a - b,
               ast.FloorDiv: lambda a, b: a // b, ast.Div: lambda a, b: a / b}
        fn = ops.get(type(node.op))
        numbers = isinstance(left, (int, float)) or isinstance(right, (int, float))
        if fn is not None and (numbers or (isinstance(left, list) and isinstance(right, list)
                                           and isinstance(node.op, ast.Add))):
            if isinstance(left, list) and isinstance(right, int) and right > 100_000:
                raise Unknown
            return fn(left, right)
    if isinstance(node, ast.Name):
        if node.id in consts:
            return consts[node.id]
        raise Unknown
    if isinstance(node, ast.Attribute):
        # F.silu, torch.bfloat16, squared_relu via a module: the callable / dtype by name
        return {"callable": node.attr}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "field":
        for kw in node.keywords:
            if kw.arg == "default":
                return evaluate(kw.value, consts)
            if kw.arg == "default_factory" and isinstance(kw.value, ast.Lambda):
                return evaluate(kw.value.body, consts)
    raise Unknown


def module_constants(tree: ast.Module) -> dict[str, object]:
    consts: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                consts[node.targets[0].id] = evaluate(node.value, consts)
            except Unknown:
                pass
        elif isinstance(node, ast.FunctionDef) and node.name[:1] != "_":
            consts[node.name] = {"callable": node.name}  # activation functions defined in the module
    return consts


def classes_of(source: str, path: str) -> dict[str, dict]:
    tree = ast.parse(source)
    consts = module_constants(tree)
    module = path[len("src/"):-len(".py")].replace("/", ".")
    out = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        fields = {}
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is not None:
                try:
                    fields[item.target.id] = evaluate(item.value, consts)
                except Unknown:
                    if "Callable" in ast.unparse(item.annotation) and isinstance(item.value, ast.Name):
                        fields[item.target.id] = {"callable": item.value.id}  # an imported activation
                    else:
                        fields[item.target.id] = None if item.target.id.startswith("_") else {"unknown": True}
        doc = ast.get_docstring(node) or ""
        out[node.name] = {
            "module": module,
            "file": path,
            "bases": [b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                      if isinstance(b, (ast.Name, ast.Attribute))],
            "own": fields,
            "hf": sorted(set(_HF_LINK.findall(doc))),
        }
    return out


def read_tag(git_dir: str, tag: str) -> tuple[str, dict[str, dict]]:
    commit = git(git_dir, "rev-list", "-n", "1", tag).strip()
    paths = [p for p in git(git_dir, "ls-tree", "-r", "--name-only", tag).splitlines() if _PATH.match(p)]
    classes: dict[str, dict] = {}
    for path in paths:
        try:
            found = classes_of(git(git_dir, "show", f"{tag}:{path}"), path)
        except (SyntaxError, subprocess.CalledProcessError):
            continue
        for name, cls in found.items():
            classes.setdefault(name, cls)
    return commit, classes


def ancestry(name: str, classes: dict[str, dict], seen: tuple[str, ...] = ()) -> list[str]:
    """Class names from ``name`` up through its bases known in this release."""
    out = [name]
    for base in classes[name]["bases"]:
        if base in classes and base not in seen and base != name:
            out += [b for b in ancestry(base, classes, seen + (name,)) if b not in out]
    return out


def is_provider(chain: list[str]) -> bool:
    return any(c in ("GPTModelProvider", "MambaModelProvider", "MLAModelProvider") for c in chain)


def build(git_dir: str, tags: list[str]) -> dict:
    """Each provider class as its own defaults per release (grouped where equal) and its direct bases, as full
    targets; megatron-core bases that change defaults are given as ``megatron.core:<name>`` with those values."""
    providers: dict[str, dict] = {}
    hf_models: dict[str, str] = {}
    commits = {}
    for tag in tags:
        commit, classes = read_tag(git_dir, tag)
        release = tag.lstrip("v")
        commits[release] = commit
        for name, cls in classes.items():
            if not is_provider(ancestry(name, classes)):
                continue
            target = f"{cls['module']}.{name}"
            bases = []
            for base in cls["bases"]:
                if base in classes:
                    bases.append(f"{classes[base]['module']}.{base}")
                elif base in CORE_BASES:
                    bases.append(f"megatron.core:{base}")
            own = dict(cls["own"])
            entry = providers.setdefault(target, {"file": cls["file"], "variants": []})
            for variant in entry["variants"]:
                if variant["own"] == own and variant["bases"] == bases:
                    variant["releases"].append(release)
                    break
            else:
                entry["variants"].append({"releases": [release], "bases": bases, "own": own})
            for hf in cls["hf"]:
                hf_models[hf] = target
    return {
        "source": "github.com/NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/models/**/*provider*.py",
        "generated_by": "scripts/gen_providers.py",
        "releases": commits,
        "core_bases": {f"megatron.core:{k}": v for k, v in CORE_BASES.items()},
        "providers": dict(sorted(providers.items())),
        "hf_models": dict(sorted(hf_models.items())),
    }


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    git_dir, tags = argv[0], argv[1:] or list(DEFAULT_TAGS)
    data = build(git_dir, tags)
    with open(OUT, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=False)
        fh.write("\n")
    print(f"{len(data['providers'])} providers from {len(tags)} releases -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
