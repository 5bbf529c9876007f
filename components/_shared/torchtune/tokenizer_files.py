"""Tokenizer files torchtune 0.6.1 needs that a model repo does not ship, derived from its tokenizer.json where
that is exact.

torchtune's Qwen2 / Qwen2.5 tokenizers read GPT-2 style `vocab.json` + `merges.txt`; a Qwen2 `tokenizer.json` (all
that transformers 5 saves) holds the same byte-level BPE as `model.vocab` and `model.merges`. The two files are
written from it only when tokenizer.json tokenizes exactly as torchtune's Qwen2Tokenizer does: NFC, a split on
torchtune's own pre-tokenizer regex, byte-level symbols, and plain merge-rank BPE (no byte fallback, dropout,
affixes or whole-word lookup). Otherwise the model is refused with that reason.

Llama 3's tiktoken file (`original/tokenizer.model`) is not derived: tiktoken merges any adjacent pair whose bytes
form a token, by token rank, while tokenizer.json lists merges; the two agree for Meta's vocabulary but not for
any vocabulary, and no file a repo ships proves which it is.

model-initialize calls `derive_tokenizer_files` on the downloaded folder; pre-flight and training accept the
model when `derivation_refused` finds nothing against it.
"""

from __future__ import annotations

import json
from pathlib import Path

from kfp_finetune.components._shared.torchtune import installed

QWEN2_FILES = ("vocab.json", "merges.txt")
_QWEN2_REGEX = ("torchtune.models.qwen2._tokenizer", "PRETOKENIZE_REGEX")
# tokenizer.json BPE model keys and the value torchtune's merge-rank BPE computes.
_PLAIN_BPE = {
    "dropout": None,
    "continuing_subword_prefix": None,
    "end_of_word_suffix": None,
    "byte_fallback": False,
    "ignore_merges": False,
}


def derivation_refused(model_dir: Path, files: tuple[str, ...]) -> str | None:
    """Why `files` cannot be derived from model_dir's tokenizer.json (None: they can)."""
    if sorted(files) != sorted(QWEN2_FILES):
        return "torchtune 0.6.1 cannot read the model's tokenizer.json instead"
    try:
        tokenizer = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "it has no readable tokenizer.json to derive them from"
    return _qwen2_bpe_refused(tokenizer)


def derive_tokenizer_files(model_dir: Path, files: tuple[str, ...]) -> list[str]:
    """Write the missing `files` from model_dir's tokenizer.json where that is exact; the names written."""
    if set(files) <= _present(model_dir) or derivation_refused(model_dir, files) is not None:
        return []
    model = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))["model"]
    written = []
    if not (model_dir / "vocab.json").is_file():
        (model_dir / "vocab.json").write_text(
            json.dumps(model["vocab"], ensure_ascii=False), encoding="utf-8"
        )
        written.append("vocab.json")
    if not (model_dir / "merges.txt").is_file():
        merges = "\n".join(_merge_lines(model["merges"]))
        (model_dir / "merges.txt").write_text(f"#version: 0.2\n{merges}\n", encoding="utf-8")
        written.append("merges.txt")
    return written


def _present(model_dir: Path) -> set[str]:
    return {name for name in QWEN2_FILES if (model_dir / name).is_file()}


def _merge_lines(merges: list) -> list[str]:
    return [" ".join(merge) if isinstance(merge, list) else merge for merge in merges]


def _qwen2_bpe_refused(tokenizer: dict) -> str | None:
    model = tokenizer.get("model") or {}
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict) or "merges" not in model:
        return "its tokenizer.json holds no BPE vocabulary and merges to derive them from"
    for key, plain in _PLAIN_BPE.items():
        if model.get(key, plain) not in (plain, ""):
            return f"its tokenizer.json sets model.{key} = {model[key]!r}, which torchtune's Qwen2 BPE does not do"
    if (tokenizer.get("normalizer") or {}).get("type") != "NFC":
        return "its tokenizer.json does not normalize to NFC, as torchtune's Qwen2 tokenizer does"
    steps = (tokenizer.get("pre_tokenizer") or {}).get("pretokenizers") or []
    regex = installed.constant(*_QWEN2_REGEX)
    split, byte_level = (steps + [{}, {}])[:2] if len(steps) == 2 else ({}, {})
    if not (
        split.get("type") == "Split"
        and split.get("pattern") == {"Regex": regex}
        and split.get("behavior") == "Isolated"
        and not split.get("invert")
        and byte_level.get("type") == "ByteLevel"
        and not byte_level.get("add_prefix_space")
        and not byte_level.get("use_regex")
    ):
        return "its tokenizer.json pre-tokenizes otherwise than torchtune's Qwen2 tokenizer (Split on its regex, ByteLevel)"
    if any(len(line.split()) != 2 for line in _merge_lines(model["merges"])):
        return "its tokenizer.json has merges with spaces inside a symbol, which merges.txt cannot hold"
    return None
