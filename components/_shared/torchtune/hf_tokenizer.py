"""A torchtune ModelTokenizer for families whose repos ship only a Hugging Face `tokenizer.json` (SmolLM2's GPT-2
style byte-level BPE, Mistral-Nemo's Tekken): the tokenizer nodes `smollm2_tokenizer` and
`mistral_nemo_tokenizer`.

Text is encoded and decoded by the `tokenizers` library from the repo's tokenizer.json, so the ids are what
transformers computes: the file's normalizer, pre-tokenizer (a Split regex, Digits, ByteLevel ...), model and
added tokens (a special token written in text is that token, as in transformers). torchtune 0.6.1's
`HuggingFaceBaseTokenizer` encodes the same way but is no ModelTokenizer: it writes no chat turns and masks
nothing. The post-processor's additions (a BOS) are left to `encode(add_bos=...)`.

One correction, as transformers makes it: Mistral's tokenizer.json files saved by transformers before 5.0 may split
text with Llama 3's regex instead of Tekken's (digits in threes, letters not by case; transformers 4.57 and 5 warn
and replace the first Split with Tekken's when loaded with `fix_mistral_regex=True`, see the Mistral-Small-3.1
discussion they link). The mistral_nemo format names Tekken's regex (mistral-common's), and a first Split with
another pattern is replaced by it: the ids are transformers' with `fix_mistral_regex=True`, the tokenization the
model was trained with (mistral-common's).

A conversation is written in the family's chat format (CHAT_FORMATS: one entry per family, each the family's
documented chat template) and masked as torchtune's tokenizers mask it:

- each message is one piece of text (its turn's opening, content and closing, special tokens included) encoded
  whole, so the ids equal those of the template's rendering encoded by transformers (every turn boundary of the
  formats here is a special token, where encoding splits anyway);
- a message's tokens carry its `masked` (prompts masked unless train_on_input; an assistant turn is trained
  whole, its opening and end token included); a BOS carries the first message's;
- the final assistant turn ends with the end token (`add_eos`), not the text a template writes after it (ChatML's
  newline); without `add_eos` it ends with its content, as torchtune's Qwen tokenizers do;
- with `max_seq_len`, an example that fits is tokenized as without it; a longer one is cut as torchtune cuts:
  its first max_seq_len - 1 tokens and the end token, masked.

Generation stops at the format's stop tokens. Tool turns (role `ipython`) are refused: no format here writes them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer
from torchtune.data import Message, truncate
from torchtune.data._prompt_templates import _get_prompt_template


@dataclass(frozen=True)
class ChatFormat:
    """How a family writes a conversation: the text around each role's content (special tokens by name)."""

    name: str  # for messages: the family's own name for the format
    turns: dict[str, tuple[str, str]]  # role -> (opening, closing); an assistant closing starts with `end`
    end: str  # ends every assistant turn; the EOS `add_eos` appends
    stop: tuple[str, ...]  # generation stops at any of these
    pad: str  # never in a prompt: generation pads with it
    bos: str | None = None  # opens every sequence (None: nothing does)
    default_system: str | None = None  # the system message a conversation not opening with one gets first
    # None: a system message is a turn of its own; else the separator after which it opens the last user message
    # (encoded with it, as the template writes it: its tokens carry that message's mask)
    system_in_last_user: str | None = None
    special: tuple[str, ...] = ()  # the other special tokens the turns write
    # the regex of the pre-tokenizer's first Split the family's tokenizer was trained with (None: as tokenizer.json)
    split_pattern: str | None = None

    def written(self) -> set[str]:
        """The tokens written in the turns' text: tokenizer.json must list them as added tokens, so that encoding
        splits them out whole."""
        return {self.end, *self.special}

    def inserted(self) -> set[str]:
        """The tokens used by id only (BOS, padding, stop tokens): any entry of the vocabulary."""
        return {self.pad, *self.stop, *([self.bos] if self.bos else [])}


# SmolLM2-Instruct's chat template: ChatML turns, and a default system prompt when the first message is no system
# message; generation_config stops at <|im_end|> (the Instruct models' eos) or <|endoftext|>.
_SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
# Tekken's split (mistral-common's tekken.json `pattern`): letters by case, single digits.
TEKKEN_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Mistral-Nemo-Instruct-2407 (Tekken, tokenizer V3): `<s>[INST]user[/INST]assistant</s>[INST]user[/INST]`, no
# whitespace around the control tokens; a system prompt opens the last user message followed by a blank line
# (mistral-common's rule, which the model card's template follows for a prompt ending in a user message).
CHAT_FORMATS: dict[str, ChatFormat] = {
    "smollm2": ChatFormat(
        name="SmolLM2's ChatML",
        turns={
            "system": ("<|im_start|>system\n", "<|im_end|>\n"),
            "user": ("<|im_start|>user\n", "<|im_end|>\n"),
            "assistant": ("<|im_start|>assistant\n", "<|im_end|>\n"),
        },
        end="<|im_end|>",
        stop=("<|im_end|>", "<|endoftext|>"),
        pad="<|endoftext|>",
        default_system=_SMOLLM2_SYSTEM,
        special=("<|im_start|>",),
    ),
    "mistral_nemo": ChatFormat(
        name="Mistral-Nemo's [INST] format (Tekken)",
        turns={"user": ("[INST]", "[/INST]"), "assistant": ("", "</s>")},
        end="</s>",
        stop=("</s>",),
        pad="<unk>",
        bos="<s>",
        system_in_last_user="\n\n",
        special=("[INST]", "[/INST]"),
        split_pattern=TEKKEN_PATTERN,
    ),
}


class HFModelTokenizer:
    """A ModelTokenizer over a tokenizer.json, writing conversations in `chat_format` (module docstring).

    Args:
        path: the model's tokenizer.json.
        chat_format: the family's CHAT_FORMATS entry.
        max_seq_len: the longest tokenized example (None: no limit); datasets read it to pack examples.
        prompt_template: a torchtune prompt template applied to the messages first, as torchtune's tokenizers do.
    """

    def __init__(
        self,
        path: str,
        chat_format: ChatFormat,
        max_seq_len: int | None = None,
        prompt_template: Any = None,
    ) -> None:
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
        if chat_format.split_pattern is not None:
            _correct_split(spec, chat_format.split_pattern)
        self.tokenizer = Tokenizer.from_str(json.dumps(spec))
        self.chat_format = chat_format
        self.max_seq_len = max_seq_len
        self.prompt_template = prompt_template
        self.special_tokens = {t["content"]: t["id"] for t in spec.get("added_tokens", [])}
        missing = [f"added token {t}" for t in sorted(chat_format.written()) if t not in self.special_tokens]
        missing += [
            f"token {t}" for t in sorted(chat_format.inserted()) if self.tokenizer.token_to_id(t) is None
        ]
        if missing:
            raise ValueError(
                f"{path} has no {', '.join(missing)}, which {chat_format.name} needs: is this the family's "
                "tokenizer.json?"
            )
        self.bos_id = self.tokenizer.token_to_id(chat_format.bos) if chat_format.bos else None
        self.eos_id = self.special_tokens[chat_format.end]
        self.pad_id = self.tokenizer.token_to_id(chat_format.pad)
        self.stop_tokens = [self.tokenizer.token_to_id(t) for t in chat_format.stop]

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> list[int]:
        """`text`'s ids as tokenizer.json encodes it (no post-processing), with the format's BOS and end token."""
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        if add_bos and self.bos_id is not None:
            ids.insert(0, self.bos_id)
        if add_eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def tokenize_messages(
        self, messages: list[Message], *, add_eos: bool = True
    ) -> tuple[list[int], list[bool]]:
        """(tokens, mask) of a conversation in the family's chat format (module docstring)."""
        if self.prompt_template is not None:
            messages = self.prompt_template(messages)
        pieces = _pieces(self.chat_format, messages)
        tokens: list[int] = []
        mask: list[bool] = []
        if self.bos_id is not None:
            tokens.append(self.bos_id)
            mask.append(pieces[0][1] if pieces else True)
        for text, masked in pieces:
            ids = self.tokenizer.encode(text, add_special_tokens=False).ids
            tokens += ids
            mask += [masked] * len(ids)
            if self.max_seq_len and len(tokens) > self.max_seq_len:
                break  # cut below; the rest cannot be kept
        if add_eos and messages and messages[-1].role == "assistant":
            tokens.append(self.eos_id)
            mask.append(mask[-1])
        if self.max_seq_len and len(tokens) > self.max_seq_len:
            # torchtune's cut (torchtune.data.truncate): the end token in the last place, masked.
            tokens = truncate(tokens, self.max_seq_len, self.eos_id if add_eos else None)
            mask = truncate(mask, self.max_seq_len, True if add_eos else None)
        return tokens, mask

    def __call__(self, sample: Mapping[str, Any], inference: bool = False) -> Mapping[str, Any]:
        """torchtune's transform: the sample's `messages` become `tokens` and `mask`."""
        messages = sample.pop("messages")
        sample["tokens"], sample["mask"] = self.tokenize_messages(messages)
        return sample


def _correct_split(spec: dict, pattern: str) -> None:
    """The pre-tokenizer's first Split (of a Sequence) splits on `pattern` (module docstring)."""
    pre_tokenizer = spec.get("pre_tokenizer") or {}
    steps = pre_tokenizer.get("pretokenizers") if pre_tokenizer.get("type") == "Sequence" else None
    if steps and steps[0].get("type") == "Split":
        steps[0]["pattern"] = {"Regex": pattern}


def _pieces(chat_format: ChatFormat, messages: list[Message]) -> list[tuple[str, bool]]:
    """(text, masked) per message, in order: each written with its role's opening and closing; a final assistant
    turn without its closing (the end token is appended by `add_eos`)."""
    for message in messages:
        if message.role not in chat_format.turns and message.role != "system":
            raise ValueError(
                f"{chat_format.name} has no {message.role!r} turns (tool calls and results are not supported)"
            )
        if any(item["type"] != "text" for item in message.content):
            raise RuntimeError(f"{chat_format.name} takes text only, not {message.content!r}")
    if chat_format.default_system is not None and messages and messages[0].role != "system":
        messages = [Message("system", chat_format.default_system, masked=True), *messages]
    system = [m for m in messages if m.role == "system"]
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=None)
    if chat_format.system_in_last_user is not None and system and last_user is None:
        raise ValueError(
            f"{chat_format.name} writes a system prompt into the last user message; there is none"
        )
    pieces = []
    for i, message in enumerate(messages):
        content = message.text_content
        if message.role == "system" and chat_format.system_in_last_user is not None:
            continue
        if i == last_user and chat_format.system_in_last_user is not None and system:
            content = "".join(m.text_content + chat_format.system_in_last_user for m in system) + content
        opening, closing = chat_format.turns[message.role]
        final_answer = message.role == "assistant" and i == len(messages) - 1
        pieces.append((opening + content + ("" if final_answer else closing), message.masked))
    return pieces


def _template(prompt_template: str | dict | None) -> Any:
    return None if prompt_template is None else _get_prompt_template(prompt_template)


def smollm2_tokenizer(
    path: str, max_seq_len: int | None = None, prompt_template: str | dict | None = None
) -> HFModelTokenizer:
    """SmolLM2's tokenizer: its tokenizer.json, SmolLM2-Instruct's ChatML turns (CHAT_FORMATS["smollm2"])."""
    return HFModelTokenizer(path, CHAT_FORMATS["smollm2"], max_seq_len, _template(prompt_template))


def mistral_nemo_tokenizer(
    path: str, max_seq_len: int | None = None, prompt_template: str | dict | None = None
) -> HFModelTokenizer:
    """Mistral-Nemo's tokenizer: its tokenizer.json (Tekken), Mistral-Nemo-Instruct's [INST] turns
    (CHAT_FORMATS["mistral_nemo"])."""
    return HFModelTokenizer(path, CHAT_FORMATS["mistral_nemo"], max_seq_len, _template(prompt_template))
