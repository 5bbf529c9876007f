"""Tokenizer builders named by the `tokenizer:` node of the configs we write: torchtune's Qwen ones, with a
truncation fix, and Qwen3's and Gemma 3's, which torchtune 0.6.1 does not have.

torchtune 0.6.1's Qwen2 and Qwen2.5 tokenizers end `tokenize_messages` with
`truncate(mask, max_seq_len, True)`, and `torchtune.data.truncate` sets the last element even when nothing is
cut: with a `max_seq_len`, every example's final end token is left out of the loss and the tuned model does not
learn to stop generating. The builders here return torchtune's own tokenizers, changed in one respect: an
example that fits in `max_seq_len` is tokenized exactly as without one; a longer one is cut by torchtune.

Qwen3 keeps Qwen2.5's vocabulary and ChatML turns (`<|im_start|>role\n ... <|im_end|>\n`), adds tokens
(`<think>`, `</think>`, `<tool_response>`, `</tool_response>`; read from the model's tokenizer.json), has no
default system prompt (neither has torchtune's Qwen2.5 tokenizer), and marks thinking. Its chat template renders
the final assistant turn after the last user message with a thinking block, empty when the answer has none:
`<|im_start|>assistant\n<think>\n\n</think>\n\n{answer}<|im_end|>\n` — what transformers' apply_chat_template
writes for such a conversation, and, up to `{answer}`, the generation prompt of non-thinking mode
(`enable_thinking=False`). `qwen3_tokenizer` writes that block for non-reasoning data (an answer that carries its
own `<think>...</think>` is tokenized as written) and trains it with the answer, as torchtune trains the whole
assistant turn (header included): the tuned model answers without reasoning in either mode, as its data does,
and evaluation prompts it as non-thinking mode does. Earlier assistant turns get no block, as in the template. The
end token of every assistant turn, `<|im_end|>`, is trained; prompts are masked (unless train_on_input);
generation stops at `<|im_end|>` or `<|endoftext|>`.

Gemma 3 keeps Gemma's SentencePiece `tokenizer.model` (torchtune's GemmaTokenizer reads it: `<bos>`, `<eos>`,
`<pad>` 0) with a 262k vocabulary holding `<start_of_turn>` and `<end_of_turn>`, and writes conversations as its
chat template does (the one in google/gemma-3-*-it's tokenizer_config.json): `<bos>`, then per turn
`<start_of_turn>{role}\n{content, trimmed}<end_of_turn>\n` with the assistant's role named `model`, a system
message's text opening the first user turn followed by a blank line. torchtune 0.6.1's Gemma tokenizer writes no
turns at all (bos, the texts run together, eos). `gemma3_tokenizer` encodes the pieces between the two turn tokens
one by one — the role line, a system prefix, the content, the newline after a turn — so each has its message's
mask (a system prefix stays masked when the user's turn is trained); that equals the template's encoding, as
Gemma's vocabulary splits pieces where the Unicode script changes (a newline never merges with the letters after
it) and adds no dummy prefix. Every assistant turn, header and `<end_of_turn>` included, is trained; prompts are
masked (unless train_on_input); with add_eos `<eos>` closes the example, as torchtune's Gemma tokenizer closes
it; generation stops at `<end_of_turn>` or `<eos>` (Gemma 3's generation_config.json). Only text: an image in a
message is refused. An example longer than `max_seq_len` is cut as torchtune cuts (its last token made `<eos>`).
"""

from __future__ import annotations

from collections.abc import Callable

from torchtune.data import Message, truncate
from torchtune.data._prompt_templates import _get_prompt_template
from torchtune.models.gemma import GemmaTokenizer
from torchtune.models.qwen2 import Qwen2Tokenizer
from torchtune.models.qwen2 import qwen2_tokenizer as torchtune_qwen2_tokenizer
from torchtune.models.qwen2_5 import qwen2_5_tokenizer as torchtune_qwen2_5_tokenizer
from torchtune.models.qwen2_5._tokenizer import QWEN2_5_SPECIAL_TOKENS, Qwen2_5Tokenizer
from torchtune.modules.transforms.tokenizers import parse_hf_tokenizer_json

# Qwen3's added tokens beyond Qwen2.5's, with their ids in the released tokenizer.json (used without one).
QWEN3_SPECIAL_TOKENS = {
    **QWEN2_5_SPECIAL_TOKENS,
    "<tool_response>": 151665,
    "</tool_response>": 151666,
    "<think>": 151667,
    "</think>": 151668,
}
EMPTY_THINKING = "<think>\n\n</think>\n\n"
START_OF_TURN, END_OF_TURN = "<start_of_turn>", "<end_of_turn>"
_GEMMA3_ROLES = {"user": "user", "assistant": "model"}  # message role -> the role Gemma 3's turns name


# One subclass per torchtune class, not a mixin: Python refuses the builders' `__class__` swap to a class with
# a mixin base ahead of torchtune's (Protocol-derived) class.
class Qwen2TokenizerTruncatingOnlyTooLong(Qwen2Tokenizer):
    def tokenize_messages(
        self, messages: list[Message], *, add_eos: bool = True
    ) -> tuple[list[int], list[bool]]:
        return _truncate_only_too_long(self, super().tokenize_messages, messages, add_eos)


class Qwen2_5TokenizerTruncatingOnlyTooLong(Qwen2_5Tokenizer):
    def tokenize_messages(
        self, messages: list[Message], *, add_eos: bool = True
    ) -> tuple[list[int], list[bool]]:
        return _truncate_only_too_long(self, super().tokenize_messages, messages, add_eos)


class Qwen3Tokenizer(Qwen2_5TokenizerTruncatingOnlyTooLong):
    """Qwen2.5's ChatML turns with Qwen3's empty thinking block on the final answer (module docstring)."""

    def _tokenize_header(self, messages: list[Message], i: int) -> list[int]:
        tokens = super()._tokenize_header(messages, i)
        if _final_answer_without_thinking(messages, i):
            # After `<|im_start|>assistant\n`, before a tool call's `<tool_call>`.
            after_role = 1 + len(self.encode("assistant\n", add_bos=False, add_eos=False))
            tokens[after_role:after_role] = self.encode(EMPTY_THINKING, add_bos=False, add_eos=False)
        return tokens


def _final_answer_without_thinking(messages: list[Message], i: int) -> bool:
    """Message i is the last, an assistant's, after a user's (the template's last query), and has no thinking."""
    message = messages[i]
    return (
        i == len(messages) - 1
        and message.role == "assistant"
        and any(m.role == "user" for m in messages[:i])
        and "</think>" not in message.text_content
    )


def _truncate_only_too_long(
    tokenizer: Qwen2Tokenizer, tokenize_messages: Callable, messages: list[Message], add_eos: bool
) -> tuple[list[int], list[bool]]:
    """torchtune's `tokenize_messages` without `max_seq_len`; run again with it when the example is too long."""
    # `max_seq_len` stays set outside this call: datasets read it to pack examples.
    max_seq_len, tokenizer.max_seq_len = tokenizer.max_seq_len, None
    try:
        tokens, mask = tokenize_messages(messages, add_eos=add_eos)
    finally:
        tokenizer.max_seq_len = max_seq_len
    if max_seq_len is None or len(tokens) <= max_seq_len:
        return tokens, mask
    return tokenize_messages(messages, add_eos=add_eos)


def qwen2_tokenizer(
    path: str,
    merges_file: str | None = None,
    special_tokens_path: str | None = None,
    max_seq_len: int | None = None,
    prompt_template: str | dict | None = None,
    **kwargs,
) -> Qwen2TokenizerTruncatingOnlyTooLong:
    """torchtune's `qwen2_tokenizer`, truncating only examples longer than `max_seq_len`."""
    tokenizer = torchtune_qwen2_tokenizer(
        path, merges_file, special_tokens_path, max_seq_len, prompt_template, **kwargs
    )
    # The builder constructs torchtune's class itself; the subclass only replaces tokenize_messages.
    tokenizer.__class__ = Qwen2TokenizerTruncatingOnlyTooLong
    return tokenizer


def qwen2_5_tokenizer(
    path: str,
    merges_file: str,
    special_tokens_path: str | None = None,
    max_seq_len: int | None = None,
    prompt_template: str | dict | None = None,
    **kwargs,
) -> Qwen2_5TokenizerTruncatingOnlyTooLong:
    """torchtune's `qwen2_5_tokenizer`, truncating only examples longer than `max_seq_len`."""
    tokenizer = torchtune_qwen2_5_tokenizer(
        path, merges_file, special_tokens_path, max_seq_len, prompt_template, **kwargs
    )
    # The builder constructs torchtune's class itself; the subclass only replaces tokenize_messages.
    tokenizer.__class__ = Qwen2_5TokenizerTruncatingOnlyTooLong
    return tokenizer


def qwen3_tokenizer(
    path: str,
    merges_file: str,
    special_tokens_path: str | None = None,
    max_seq_len: int | None = None,
    prompt_template: str | dict | None = None,
    **kwargs,
) -> Qwen3Tokenizer:
    """Qwen3's tokenizer: vocab.json + merges.txt (Qwen2.5's), the added tokens of `special_tokens_path` (the model's
    tokenizer.json; None: the released ids), Qwen3's chat turns (module docstring), truncating only examples longer
    than `max_seq_len`."""
    special_tokens = (
        QWEN3_SPECIAL_TOKENS if special_tokens_path is None else parse_hf_tokenizer_json(special_tokens_path)
    )
    return Qwen3Tokenizer(
        path=path,
        merges_file=merges_file,
        special_tokens=special_tokens,
        max_seq_len=max_seq_len,
        prompt_template=None if prompt_template is None else _get_prompt_template(prompt_template),
        **kwargs,
    )


class Gemma3Tokenizer(GemmaTokenizer):
    """Gemma's SentencePiece tokenizer writing Gemma 3's chat turns (module docstring)."""

    def __init__(self, path: str, max_seq_len: int | None = None, prompt_template=None) -> None:
        super().__init__(path=path, max_seq_len=max_seq_len, prompt_template=prompt_template)
        self.start_of_turn_id = self._token_id(path, START_OF_TURN)
        self.end_of_turn_id = self._token_id(path, END_OF_TURN)
        self.stop_tokens = [self.end_of_turn_id, self.eos_id]

    def _token_id(self, path: str, piece: str) -> int:
        spm = self._spm_model.spm_model
        token_id = spm.piece_to_id(piece)
        if token_id == spm.unk_id():
            raise ValueError(f"{path} has no {piece} token: is it Gemma 3's tokenizer.model?")
        return token_id

    def tokenize_messages(
        self, messages: list[Message], *, add_eos: bool = True
    ) -> tuple[list[int], list[bool]]:
        templated = self.prompt_template(messages) if self.prompt_template is not None else messages
        system = [m for m in templated[:1] if m.role == "system"]
        turns = templated[len(system) :]
        tokens, mask = [self.bos_id], [templated[0].masked]
        for i, message in enumerate(turns):
            role = _GEMMA3_ROLES.get(message.role)
            if role is None:
                raise ValueError(
                    f"Gemma 3's chat format has user and assistant turns (and a first system message), not "
                    f"{message.role!r}"
                )
            pieces = [([self.start_of_turn_id] + self._text(f"{role}\n"), message.masked)]
            if i == 0 and system:
                pieces.append((self._text(_text_content(system[0]) + "\n\n"), system[0].masked))
            pieces.append((self._text(_text_content(message).strip()), message.masked))
            pieces.append(([self.end_of_turn_id] + self._text("\n"), message.masked))
            for piece, masked in pieces:
                tokens += piece
                mask += [masked] * len(piece)
        if add_eos:
            tokens.append(self.eos_id)
            mask.append(mask[-1])
        if self.max_seq_len and len(tokens) > self.max_seq_len:
            tokens = truncate(tokens, self.max_seq_len, self.eos_id if add_eos else None)
            mask = truncate(mask, self.max_seq_len, True if add_eos else None)
        return tokens, mask

    def _text(self, text: str) -> list[int]:
        return self.encode(text, add_bos=False, add_eos=False) if text else []


def _text_content(message: Message) -> str:
    if any(item["type"] != "text" for item in message.content):
        raise ValueError("Gemma 3 is tuned here on text only: a message holds an image")
    return message.text_content


def gemma3_tokenizer(
    path: str, max_seq_len: int | None = None, prompt_template: str | dict | None = None
) -> Gemma3Tokenizer:
    """Gemma 3's tokenizer: its tokenizer.model, Gemma 3's chat turns (module docstring), examples longer than
    `max_seq_len` cut."""
    return Gemma3Tokenizer(
        path=path,
        max_seq_len=max_seq_len,
        prompt_template=None if prompt_template is None else _get_prompt_template(prompt_template),
    )
