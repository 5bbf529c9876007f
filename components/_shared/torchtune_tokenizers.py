"""torchtune tokenizer builders with a truncation fix, named by the `tokenizer:` node of the configs we write.

torchtune 0.6.1's Qwen2 and Qwen2.5 tokenizers end `tokenize_messages` with
`truncate(mask, max_seq_len, True)`, and `torchtune.data.truncate` sets the last element even when nothing is
cut: with a `max_seq_len`, every example's final end token is left out of the loss and the tuned model does not
learn to stop generating. The builders here return torchtune's own tokenizers, changed in one respect: an
example that fits in `max_seq_len` is tokenized exactly as without one; a longer one is cut by torchtune.
"""

from __future__ import annotations

from collections.abc import Callable

from torchtune.data import Message
from torchtune.models.qwen2 import Qwen2Tokenizer
from torchtune.models.qwen2 import qwen2_tokenizer as torchtune_qwen2_tokenizer
from torchtune.models.qwen2_5 import qwen2_5_tokenizer as torchtune_qwen2_5_tokenizer
from torchtune.models.qwen2_5._tokenizer import Qwen2_5Tokenizer


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
