"""The fixed Qwen tokenizers: as without max_seq_len unless an example is too long, then cut as torchtune cuts; and
Qwen3's: its chat format as transformers renders it, masked and stopped as training and generation need."""

import json
from pathlib import Path

import pytest
from torchtune.data import Message
from torchtune.models.qwen2 import Qwen2Tokenizer
from torchtune.models.qwen2 import qwen2_tokenizer as torchtune_qwen2_tokenizer
from torchtune.models.qwen2_5 import qwen2_5_tokenizer as torchtune_qwen2_5_tokenizer
from transformers import PreTrainedTokenizerFast

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


# --- Qwen3 ------------------------------------------------------------------------------------------------------

# Qwen3's chat format as its model card and chat template document it, written here (not taken from a hub file):
# ChatML turns, no default system prompt; the assistant turns after the last user message open with a thinking
# block (empty for an answer without one) when they are the last turn or carry reasoning; reasoning in earlier
# turns is dropped; the generation prompt of non-thinking mode ends with the empty block.
QWEN3_TEMPLATE = """
{%- set ns = namespace(last_query=messages|length - 1) -%}
{%- for message in messages -%}{%- if message.role == 'user' -%}{%- set ns.last_query = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
  {%- if message.role == 'assistant' -%}
    {%- set content = message.content -%}{%- set reasoning = '' -%}
    {%- if '</think>' in content -%}
      {%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
      {%- set content = content.split('</think>')[-1].lstrip('\n') -%}
    {%- endif -%}
    {%- if loop.index0 > ns.last_query and (loop.last or reasoning) -%}
      {{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') -}}
    {%- else -%}
      {{- '<|im_start|>assistant\n' + content -}}
    {%- endif -%}
    {{- '<|im_end|>\n' -}}
  {%- else -%}
    {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
  {%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}
"""
CONVERSATIONS = {
    "one turn, with a system prompt": [
        ("system", "Answer in capitals."), ("user", "Uppercase: c a t s"), ("assistant", "C A T S"),
    ],
    "one turn, no system prompt": [("user", "Uppercase: c a t s"), ("assistant", "C A T S")],
    "two turns": [
        ("user", "Uppercase: c a t s"), ("assistant", "C A T S"), ("user", "Uppercase: d o g"), ("assistant", "D O G"),
    ],
    "an answer with its reasoning": [
        ("user", "Uppercase: c a t s"), ("assistant", "<think>\nfour letters\n</think>\n\nC A T S"),
    ],
}  # fmt: skip


@pytest.fixture(scope="module")
def qwen3_files(tiny_qwen3):
    model = inspect_model_dir(tiny_qwen3)
    return {**model.tokenizer_paths, "special_tokens_path": model.special_tokens_path}


@pytest.fixture(scope="module")
def rendered(tiny_qwen3):
    """Token ids of the documented template rendered by transformers' apply_chat_template (tokenizer.json)."""
    hf_tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tiny_qwen3 / "tokenizer.json"))

    def render(turns, **options):
        messages = [{"role": role, "content": content} for role, content in turns]
        text = hf_tokenizer.apply_chat_template(
            messages, chat_template=QWEN3_TEMPLATE, tokenize=False, **options
        )
        return hf_tokenizer(text, add_special_tokens=False)["input_ids"]

    return render


def qwen3_messages(turns):
    return [Message(role, content, masked=role != "assistant") for role, content in turns]


@pytest.mark.parametrize("turns", CONVERSATIONS.values(), ids=CONVERSATIONS.keys())
def test_qwen3_tokenizes_a_conversation_as_transformers_renders_qwen3s_template(turns, qwen3_files, rendered):
    """The same tokens as transformers' rendering, but the last: an example ends with its end token (<|im_end|>),
    not the newline after it."""
    tokenizer = torchtune_tokenizers.qwen3_tokenizer(**qwen3_files)
    tokens, mask = tokenizer.tokenize_messages(qwen3_messages(turns))
    expected = rendered(turns)
    assert tokens == expected[:-1] and tokenizer.decode(expected[-1:]) == "\n"
    assert tokens[-1] == tokenizer.im_end_id and mask[-1] is False  # the answer's end token is trained


def test_qwen3_trains_the_final_answer_with_its_empty_thinking_block_and_masks_the_prompt(
    qwen3_files, rendered
):
    turns = CONVERSATIONS["two turns"]
    tokenizer = torchtune_tokenizers.qwen3_tokenizer(**qwen3_files)
    tokens, mask = tokenizer.tokenize_messages(qwen3_messages(turns))
    trained = [token for token, masked in zip(tokens, mask, strict=True) if not masked]
    # Every assistant turn is trained whole (header and end token, as torchtune trains one); only the final
    # answer opens with the thinking block, empty for this data.
    first, final = (
        f"<|im_start|>assistant\n{a}<|im_end|>" for a in ("C A T S", "<think>\n\n</think>\n\nD O G")
    )
    assert tokenizer.decode(trained, skip_special_tokens=False) == f"{first}\n{final}"
    # What precedes the final answer's text is the generation prompt of non-thinking mode: what evaluation
    # (and a user with enable_thinking=False) prompts the tuned model with.
    prompt = rendered(turns[:-1], add_generation_prompt=True, enable_thinking=False)
    assert tokens[: len(prompt)] == prompt
    assert tokenizer.decode(tokens[len(prompt) :], skip_special_tokens=False) == "D O G<|im_end|>"


def test_qwen3_stops_generating_at_either_end_token_and_keeps_the_truncation_fix(qwen3_files):
    tokenizer_json = json.loads(Path(qwen3_files["special_tokens_path"]).read_text())
    added = {token["content"]: token["id"] for token in tokenizer_json["added_tokens"]}
    tokenizer = torchtune_tokenizers.qwen3_tokenizer(**qwen3_files)
    assert set(tokenizer.stop_tokens) == {added["<|im_end|>"], added["<|endoftext|>"]}
    without_json = {k: v for k, v in qwen3_files.items() if k != "special_tokens_path"}
    released = torchtune_tokenizers.qwen3_tokenizer(**without_json).special_tokens  # Qwen3's own ids
    assert (released["<|im_end|>"], released["<think>"], released["</think>"]) == (151645, 151667, 151668)
    turns = qwen3_messages(CONVERSATIONS["one turn, no system prompt"])
    tokens, mask = tokenizer.tokenize_messages(turns)
    fits = torchtune_tokenizers.qwen3_tokenizer(**qwen3_files, max_seq_len=len(tokens))
    assert fits.tokenize_messages(turns) == (tokens, mask)
    cut = torchtune_tokenizers.qwen3_tokenizer(**qwen3_files, max_seq_len=len(tokens) - 2)
    assert cut.tokenize_messages(turns) == (
        tokens[: len(tokens) - 3] + [tokenizer.eos_id],
        mask[:-3] + [True],
    )
