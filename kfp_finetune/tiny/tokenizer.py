"""A tiny tokenizer, written in the file layouts of the real Llama-3.x, Qwen2.5, Qwen3, Gemma 3, SmolLM2 and
Mistral-Nemo repos.

A byte-level BPE is trained with the `tokenizers` library (Gemma 3: a SentencePiece BPE with the
`sentencepiece` trainer) on a fixed synthetic corpus (the chat-template words, the task text of
`kfp_finetune.tiny.dataset` and some common English), so the tokenizer depends only on the family, never on
the model seed. The family's special tokens get small ids right after the base vocabulary (Gemma 3: before
it, as in Gemma's own: `<pad>` 0, `<eos>` 1, `<bos>` 2, `<unk>` 3, then `<start_of_turn>`, `<end_of_turn>`).

Files written:
- Llama-3.x, Qwen2.5, Qwen3, SmolLM2, Mistral-Nemo: `tokenizer.json` (a complete HF `tokenizers` file; torchtune
  reads its `added_tokens`);
- every family: `tokenizer_config.json` (with the family's chat template), `special_tokens_map.json`;
- Llama-3.x: `original/tokenizer.model` — tiktoken ranks (base64 bytes + space + rank per line);
- Qwen2.5 and Qwen3: `vocab.json` + `merges.txt` in GPT-2 byte-to-unicode form;
- Gemma 3: `tokenizer.model` — a SentencePiece model trained as Gemma's is set up (byte fallback, digits split,
  no dummy prefix, whitespace kept, the two turn tokens as user-defined symbols);
- SmolLM2 and Mistral-Nemo: nothing else, as their tokenizer.json is what the project reads; their special tokens
  take the first ids (SmolLM2's 0-16, Tekken's control tokens), as in the real files, and each pre-tokenizes as
  the real file does (SmolLM2: single digits, then GPT-2's byte-level split; Tekken: its own Split regex, then
  bytes).
"""

from __future__ import annotations

import base64
import json
import random
from dataclasses import dataclass
from pathlib import Path

# Base vocabulary: the 256 bytes + merges learned from the corpus (special tokens come on top).
BASE_VOCAB_SIZE = 448

# The pre-tokenizer regexes of the real tokenizers (the same ones torchtune uses when encoding).
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Every token torchtune 0.6.1's Llama3Tokenizer looks up, in the order of its canonical ids
# (128000 + i), so the tiny ids keep the same relative layout.
LLAMA3_SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|image|>",
    "<|video|>",
]

# Qwen2.5's added tokens (151643 + i in the real tokenizer).
QWEN2_5_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
]

# Qwen3 adds these after Qwen2.5's (151665 + i), as plain added tokens (not special: decoding keeps them).
QWEN3_ADDED_TOKENS = ["<tool_response>", "</tool_response>", "<think>", "</think>"]

# SmolLM2's special tokens, ids 0-16 of its tokenizer.json.
SMOLLM2_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<repo_name>",
    "<reponame>",
    "<file_sep>",
    "<filename>",
    "<gh_stars>",
    "<issue_start>",
    "<issue_comment>",
    "<issue_closed>",
    "<jupyter_start>",
    "<jupyter_text>",
    "<jupyter_code>",
    "<jupyter_output>",
    "<jupyter_script>",
    "<empty_output>",
]
# Tekken's first control tokens (ids 0-9); the real file reserves ids up to 999 for more (<SPECIAL_n>), here 31.
TEKKEN_SPECIAL_TOKENS = [
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    *(f"<SPECIAL_{i}>" for i in range(10, 32)),
]

LLAMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Qwen3's format without tools and reasoning: the final answer after the last user message opens with an empty
# thinking block, as does the generation prompt with enable_thinking=False (tokenizer_builders.qwen3_tokenizer).
QWEN3_CHAT_TEMPLATE = (
    "{% set ns = namespace(last_query=messages|length) %}"
    "{% for message in messages %}{% if message['role'] == 'user' %}{% set ns.last_query = loop.index0 %}"
    "{% endif %}{% endfor %}"
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' and loop.last and loop.index0 > ns.last_query"
    " and '</think>' not in message['content'] %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}"
    "{{ message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{% endif %}{% endif %}"
)

# google/gemma-3-*-it's chat template (tokenizer_config.json), text parts only.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- set loop_messages = messages[1:] -%}"
    '{%- else -%}{%- set first_user_prefix = "" -%}{%- set loop_messages = messages -%}{%- endif -%}'
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif -%}"
    "{%- if (message['role'] == 'assistant') -%}{%- set role = 'model' -%}{%- else -%}"
    "{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
GEMMA3_SPECIAL_TOKENS = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
GEMMA3_TURN_TOKENS = ["<start_of_turn>", "<end_of_turn>"]  # ids 4, 5 (Gemma 3: 105, 106)
GEMMA3_VOCAB_SIZE = 768
# SmolLM2-Instruct's ChatML, with its default system prompt.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Mistral-Nemo-Instruct's [INST] turns (Tekken); a system prompt opens the last user message.
MISTRAL_NEMO_CHAT_TEMPLATE = (
    "{% set system = messages | selectattr('role', 'equalto', 'system') | map(attribute='content') | list %}"
    "{% set users = messages | selectattr('role', 'equalto', 'user') | list %}{{ bos_token }}"
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST]' }}"
    "{% if system and message == users[-1] %}{{ system[0] + '\\n\\n' }}{% endif %}"
    "{{ message['content'] + '[/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
)

# Common English so the merges also cover ordinary prompts, not only the task.
_ENGLISH = (
    "the of and to in is you that it he was for on are as with his they at be this have from or one had "
    "by word but not what all were we when your can said there use an each which she do how their if will "
    "up other about out many then them these so some her would make like him into time has look two more "
    "write go see number no way could people my than first water been call who oil its now find long down "
    "day did get come made may part hello world question answer instruction input output response text "
    "model data train test example please reverse letters word sort list name value true false yes"
)


@dataclass(frozen=True)
class TinyTokenizer:
    """What a family's tokenizer looks like once written: ids the model config needs."""

    base_vocab_size: int
    special_tokens: dict[str, int]  # added token (special, and for Qwen3 also plain) -> id

    @property
    def num_tokens(self) -> int:
        return self.base_vocab_size + len(self.special_tokens)


def training_corpus() -> list[str]:
    """The fixed corpus the BPE is trained on (independent of any seed the caller passes)."""
    from kfp_finetune.tiny.dataset import make_example

    rng = random.Random(1234)
    lines = [_ENGLISH, _ENGLISH.capitalize()]
    # Chat-template words as both templates tokenize them (role names, blank lines).
    lines += ["system\n\nuser\n\nassistant\n\n", "system\nuser\nassistant\n"] * 50
    lines += [" ".join(make_example(rng)) for _ in range(2000)]
    lines += ["0 1 2 3 4 5 6 7 8 9 10 100 2024 3.14 a, b. c! d? (e) [f] {g} 'h' \"i\" j: k; l-m n_o p/q"]
    return lines


def _byte_level_bpe(pattern: str):
    """An untrained byte-level BPE that pre-tokenizes like the real family tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _train(pattern: str):
    from tokenizers import pre_tokenizers, trainers

    tokenizer = _byte_level_bpe(pattern)
    trainer = trainers.BpeTrainer(
        vocab_size=BASE_VOCAB_SIZE,
        show_progress=False,
        # All 256 bytes, so any text encodes; the trainer orders them like GPT-2 (ids 0..255).
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(training_corpus(), trainer=trainer)
    return tokenizer


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-to-unicode table, inverted (unicode char -> byte)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


def _write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_tokenizer(out_dir: Path, family: str) -> TinyTokenizer:
    """Train the tiny BPE and write the family's tokenizer files into `out_dir`."""
    from tokenizers import AddedToken, processors

    if family == "gemma3":
        return _write_gemma3_tokenizer(out_dir)
    if family in _TOKENIZER_JSON_ONLY:
        return _write_tokenizer_json_only(out_dir, family)

    is_llama = family == "llama3_2"
    tokenizer = _train(LLAMA3_PATTERN if is_llama else QWEN2_PATTERN)
    vocab = tokenizer.get_vocab()
    base_vocab_size = len(vocab)
    specials = LLAMA3_SPECIAL_TOKENS if is_llama else QWEN2_5_SPECIAL_TOKENS
    added = QWEN3_ADDED_TOKENS if family == "qwen3" else []
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    special_ids = {t: tokenizer.token_to_id(t) for t in specials + added}
    # The added tokens must sit right after the base vocabulary, in list order.
    assert list(special_ids.values()) == list(range(base_vocab_size, base_vocab_size + len(special_ids)))

    if is_llama:
        bos, eos = "<|begin_of_text|>", "<|eot_id|>"
        # Like the real Llama-3 tokenizer.json: every encoding starts with <|begin_of_text|>.
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, special_ids[bos])]
        )
        pad, chat_template, tokenizer_class = None, LLAMA3_CHAT_TEMPLATE, "PreTrainedTokenizerFast"
    else:
        bos, eos, pad = None, "<|im_end|>", "<|endoftext|>"
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
        chat_template = QWEN3_CHAT_TEMPLATE if family == "qwen3" else CHATML_TEMPLATE
        tokenizer_class = "Qwen2TokenizerFast"

    tokenizer.save(str(out_dir / "tokenizer.json"))
    ordered = sorted(vocab.items(), key=lambda item: item[1])
    if is_llama:
        # tiktoken ranks: raw token bytes (base64) and the rank, which is the token id.
        byte_of = _byte_decoder()
        lines = [
            base64.b64encode(bytes(byte_of[c] for c in token)).decode("ascii") + f" {rank}"
            for token, rank in ordered
        ]
        (out_dir / "original").mkdir(exist_ok=True)
        (out_dir / "original" / "tokenizer.model").write_text("\n".join(lines) + "\n", encoding="ascii")
    else:
        _write_json(out_dir / "vocab.json", dict(ordered))
        merges = json.loads(tokenizer.to_str())["model"]["merges"]
        merge_lines = [" ".join(m) if isinstance(m, list) else m for m in merges]
        (out_dir / "merges.txt").write_text(
            "#version: 0.2\n" + "\n".join(merge_lines) + "\n", encoding="utf-8"
        )

    special_map = {"bos_token": bos, "eos_token": eos, "pad_token": pad}
    _write_tokenizer_configs(out_dir, special_map, specials, chat_template, tokenizer_class)
    return TinyTokenizer(base_vocab_size=base_vocab_size, special_tokens=special_ids)


def _write_tokenizer_configs(
    out_dir: Path, special_map: dict, specials: list[str], chat_template: str, tokenizer_class: str
) -> None:
    """special_tokens_map.json and tokenizer_config.json: the named special tokens (None: the family has none),
    the others as additional special tokens, the chat template."""
    special_map = {k: v for k, v in special_map.items() if v is not None}
    _write_json(out_dir / "special_tokens_map.json", special_map)
    _write_json(
        out_dir / "tokenizer_config.json",
        {
            **special_map,
            "additional_special_tokens": [t for t in specials if t not in special_map.values()],
            "chat_template": chat_template,
            "clean_up_tokenization_spaces": False,
            "model_max_length": 2048,
            "tokenizer_class": tokenizer_class,
        },
    )


def _write_gemma3_tokenizer(out_dir: Path) -> TinyTokenizer:
    """A SentencePiece BPE set up as Gemma's tokenizer.model is (module docstring), trained single-threaded on the
    corpus plus Gemma 3's turns, so the bytes depend on nothing else."""
    import io

    import sentencepiece

    turns = ["<start_of_turn>user\n", "<end_of_turn>\n<start_of_turn>model\n"] * 50
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(training_corpus() + turns),
        model_writer=model,
        model_type="bpe",
        vocab_size=GEMMA3_VOCAB_SIZE,
        character_coverage=1.0,
        byte_fallback=True,
        split_digits=True,
        add_dummy_prefix=False,
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        normalization_rule_name="identity",
        user_defined_symbols=GEMMA3_TURN_TOKENS,
        **{f"{name[1:-1]}_id": token_id for name, token_id in GEMMA3_SPECIAL_TOKENS.items()},
        **{f"{name[1:-1]}_piece": name for name in GEMMA3_SPECIAL_TOKENS},
        num_threads=1,
        minloglevel=2,
    )
    (out_dir / "tokenizer.model").write_bytes(model.getvalue())
    special_map = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}
    _write_json(out_dir / "special_tokens_map.json", special_map)
    _write_json(
        out_dir / "tokenizer_config.json",
        {
            **special_map,
            "additional_special_tokens": GEMMA3_TURN_TOKENS,
            "add_bos_token": True,
            "add_eos_token": False,
            "chat_template": GEMMA3_CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "model_max_length": 2048,
            "tokenizer_class": "GemmaTokenizer",
        },
    )
    specials = {**GEMMA3_SPECIAL_TOKENS, **{t: 4 + i for i, t in enumerate(GEMMA3_TURN_TOKENS)}}
    return TinyTokenizer(base_vocab_size=GEMMA3_VOCAB_SIZE - len(specials), special_tokens=specials)


# family -> (special tokens, which come first, bos, eos, pad, chat template)
_TOKENIZER_JSON_ONLY = {
    "smollm2": (SMOLLM2_SPECIAL_TOKENS, None, "<|im_end|>", "<|im_end|>", SMOLLM2_CHAT_TEMPLATE),
    "mistral_nemo": (TEKKEN_SPECIAL_TOKENS, "<s>", "</s>", None, MISTRAL_NEMO_CHAT_TEMPLATE),
}


def _write_tokenizer_json_only(out_dir: Path, family: str) -> TinyTokenizer:
    """SmolLM2's or Mistral-Nemo's files: tokenizer.json (special tokens first), tokenizer_config.json,
    special_tokens_map.json."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from kfp_finetune.components._shared.torchtune.hf_tokenizer import TEKKEN_PATTERN

    specials, bos, eos, pad, chat_template = _TOKENIZER_JSON_ONLY[family]
    tokenizer = Tokenizer(models.BPE())
    if family == "smollm2":
        split = pre_tokenizers.Digits(individual_digits=True)
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        split = pre_tokenizers.Split(Regex(TEKKEN_PATTERN), behavior="isolated", invert=False)
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=len(specials) + BASE_VOCAB_SIZE,
        show_progress=False,
        special_tokens=specials,  # ids 0 .. len - 1, added as special tokens
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(training_corpus(), trainer=trainer)
    special_ids = {t: tokenizer.token_to_id(t) for t in specials}
    assert list(special_ids.values()) == list(range(len(specials)))
    if bos is None:  # GPT-2's: no tokens added
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    else:  # every encoding starts with <s>
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, special_ids[bos])]
        )
    tokenizer.save(str(out_dir / "tokenizer.json"))

    special_map = {"bos_token": bos, "eos_token": eos, "pad_token": pad, "unk_token": specials[0]}
    _write_tokenizer_configs(out_dir, special_map, specials, chat_template, "PreTrainedTokenizerFast")
    base_vocab_size = tokenizer.get_vocab_size() - len(specials)
    return TinyTokenizer(base_vocab_size=base_vocab_size, special_tokens=special_ids)
