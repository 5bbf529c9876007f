"""The fixed Qwen tokenizers: as without max_seq_len unless an example is too long, then cut as torchtune cuts."""

import pytest
from torchtune.data import Message
from torchtune.models.qwen2 import Qwen2Tokenizer
from torchtune.models.qwen2 import qwen2_tokenizer as torchtune_qwen2_tokenizer
from torchtune.models.qwen2_5 import qwen2_5_tokenizer as torchtune_qwen2_5_tokenizer

from kfp_finetune.components._shared import torchtune_tokenizers
from kfp_finetune.components._shared.torchtune_model import inspect_model_dir

# family -> (our builder, torchtune's builder)
BUILDERS = {
    "qwen2": (torchtune_tokenizers.qwen2_tokenizer, torchtune_qwen2_tokenizer),
    "qwen2_5": (torchtune_tokenizers.qwen2_5_tokenizer, torchtune_qwen2_5_tokenizer),
}
CHAT = [
    Message("system", "Answer in capitals.", masked=True),
    Message("user", "Uppercase: c a t s", masked=True),
    Message("assistant", "C A T S"),
]


@pytest.fixture(scope="module")
def tokenizer_files(tiny_qwen):
    model = inspect_model_dir(tiny_qwen)
    return {**model.tokenizer_paths, "special_tokens_path": model.special_tokens_path}


def tokenize(builder, files, max_seq_len, add_eos=True):
    return builder(**files, max_seq_len=max_seq_len).tokenize_messages(CHAT, add_eos=add_eos)


@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_torchtune_masks_the_end_token_of_an_example_that_fits(family, tokenizer_files):
    """What the fix is for: if a torchtune upgrade no longer does this, the fixed builders can go."""
    _, torchtune_builder = BUILDERS[family]
    tokens, mask = tokenize(torchtune_builder, tokenizer_files, None)
    assert mask[-1] is False
    assert tokenize(torchtune_builder, tokenizer_files, len(tokens) + 1) == (tokens, mask[:-1] + [True])


@pytest.mark.parametrize("add_eos", [True, False])
@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_an_example_that_fits_is_tokenized_as_without_max_seq_len(family, add_eos, tokenizer_files):
    builder, _ = BUILDERS[family]
    tokens, mask = tokenize(builder, tokenizer_files, None, add_eos)
    assert mask[-1] is False  # the answer's last token (with add_eos: the end token) is trained on
    for max_seq_len in (len(tokens), len(tokens) + 1, 4096):
        assert tokenize(builder, tokenizer_files, max_seq_len, add_eos) == (tokens, mask), max_seq_len


@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_an_example_too_long_is_cut_as_torchtune_cuts_it(family, tokenizer_files):
    builder, torchtune_builder = BUILDERS[family]
    tokens, mask = tokenize(builder, tokenizer_files, None)
    eos_id = builder(**tokenizer_files).eos_id
    for max_seq_len in (len(tokens) - 1, 5):
        cut_tokens, cut_mask = tokenize(builder, tokenizer_files, max_seq_len)
        assert (cut_tokens, cut_mask) == tokenize(torchtune_builder, tokenizer_files, max_seq_len)
        # torchtune's cut: the first max_seq_len - 1 tokens as they were, then the end token, masked.
        assert cut_tokens == tokens[: max_seq_len - 1] + [eos_id]
        assert cut_mask == mask[: max_seq_len - 1] + [True]


def test_the_tokenizer_is_torchtunes_and_keeps_its_max_seq_len(tokenizer_files):
    """Datasets read `max_seq_len` to pack examples; tokenizing must leave it set."""
    tokenizer = torchtune_tokenizers.qwen2_5_tokenizer(**tokenizer_files, max_seq_len=64)
    tokenizer({"messages": CHAT})
    assert isinstance(tokenizer, Qwen2Tokenizer)
    assert tokenizer.max_seq_len == 64
