"""The vocabulary a job's model has when the config names only its tokenizer.

Bridge recipes and Megatron-LM scripts often give ``tokenizer.tokenizer_model`` / ``--tokenizer-model`` (a Hugging
Face model id) and no ``vocab_size``: the embedding then has the model's vocabulary (``vocab_size`` in that
model's Hugging Face ``config.json``, which also counts the reserved tokens, so it can exceed the tokenizer's
length). Only families whose ``config.json`` values are published are known; anything else is left to the caller,
which says the vocabulary is assumed.
"""

from __future__ import annotations

import re
from typing import Any

# (pattern on the model id or a local path ending in it, vocab_size in the model's config.json)
KNOWN: tuple[tuple[str, int], ...] = (
    (r"llama-?3(\.\d)?", 128256),  # meta-llama/Meta-Llama-3-8B, Llama-3.1-405B, Llama-3.2-1B, Llama-3.3-70B
    (r"llama-?2", 32000),
    (r"qwen3-?next", 151936),
    (r"qwen3", 151936),  # Qwen/Qwen3-0.6B ... Qwen3-235B-A22B
    (r"mixtral-8x22b", 32768),
    (r"mixtral-8x7b", 32000),
    (r"mistral-7b-(instruct-)?v0\.[12]", 32000),
    (r"mistral-7b-(instruct-)?v0\.3", 32768),
    (r"deepseek-v3|deepseek-r1", 129280),
    (r"deepseek-v2", 102400),
    (r"gpt-oss", 201088),  # openai/gpt-oss-20b, gpt-oss-120b (o200k_harmony)
    (r"nemotron-h|nemotron-nano-(9b|12b)-v2", 131072),
)


def vocab_of(tokenizer: Any) -> tuple[int, str] | None:
    """(vocab_size, the tokenizer it was known from) or None."""
    if not isinstance(tokenizer, str) or not tokenizer.strip():
        return None
    name = tokenizer.strip().rstrip("/").lower()
    return next(((vocab, tokenizer.strip()) for pattern, vocab in KNOWN if re.search(pattern, name)), None)


TOKENIZER_KEYS = ("tokenizer.tokenizer_model", "tokenizer.hf_tokenizer_path", "mlm.tokenizer_model",
                  "model.hf_model_id")
VOCAB_KEYS = ("model.vocab_size", "tokenizer.vocab_size", "mlm.vocab_size", "model.padded_vocab_size",
              "mlm.padded_vocab_size")


def apply_tokenizer_vocab(view: Any) -> None:
    """Set ``model.vocab_size`` from a known tokenizer when no vocabulary is given (origin ``tokenizer:<name>``)."""
    if any(view.get(k) is not None for k in VOCAB_KEYS):
        return
    for key in TOKENIZER_KEYS:
        found = vocab_of(view.get(key))
        if found is not None:
            view.set("model.vocab_size", found[0], f"tokenizer:{found[1]}")
            return
