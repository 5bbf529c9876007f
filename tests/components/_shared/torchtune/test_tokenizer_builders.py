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

from kfp_finetune.components._shared.torchtune import tokenizer_builders
from kfp_finetune.components._shared.torchtune.model_inspection import inspect_model_dir

# family -> (our builder, torchtune's builder)
BUILDERS = {
    "qwen2": (tokenizer_builders.qwen2_tokenizer, torchtune_qwen2_tokenizer),
    "qwen2_5": (tokenizer_builders.qwen2_5_tokenizer, torchtune_qwen2_5_tokenizer),
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
    tokenizer = tokenizer_builders.qwen2_5_tokenizer(**tokenizer_files, max_seq_len=64)
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
    tokenizer = tokenizer_builders.qwen3_tokenizer(**qwen3_files)
    tokens, mask = tokenizer.tokenize_messages(qwen3_messages(turns))
    expected = rendered(turns)
    assert tokens == expected[:-1] and tokenizer.decode(expected[-1:]) == "\n"
    assert tokens[-1] == tokenizer.im_end_id and mask[-1] is False  # the answer's end token is trained


def test_qwen3_trains_the_final_answer_with_its_empty_thinking_block_and_masks_the_prompt(
    qwen3_files, rendered
):
    turns = CONVERSATIONS["two turns"]
    tokenizer = tokenizer_builders.qwen3_tokenizer(**qwen3_files)
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
    tokenizer = tokenizer_builders.qwen3_tokenizer(**qwen3_files)
    assert set(tokenizer.stop_tokens) == {added["<|im_end|>"], added["<|endoftext|>"]}
    without_json = {k: v for k, v in qwen3_files.items() if k != "special_tokens_path"}
    released = tokenizer_builders.qwen3_tokenizer(**without_json).special_tokens  # Qwen3's own ids
    assert (released["<|im_end|>"], released["<think>"], released["</think>"]) == (151645, 151667, 151668)
    turns = qwen3_messages(CONVERSATIONS["one turn, no system prompt"])
    tokens, mask = tokenizer.tokenize_messages(turns)
    fits = tokenizer_builders.qwen3_tokenizer(**qwen3_files, max_seq_len=len(tokens))
    assert fits.tokenize_messages(turns) == (tokens, mask)
    cut = tokenizer_builders.qwen3_tokenizer(**qwen3_files, max_seq_len=len(tokens) - 2)
    assert cut.tokenize_messages(turns) == (
        tokens[: len(tokens) - 3] + [tokenizer.eos_id],
        mask[:-3] + [True],
    )


# Gemma 3's chat format as google/gemma-3-*-it's chat template writes it (text parts), written here: <bos>, then
# per turn <start_of_turn>{user|model}\n{content trimmed}<end_of_turn>\n; a system message's text and a blank line
# open the first user turn; the generation prompt is <start_of_turn>model\n.
GEMMA3_TEMPLATE = """
{{- bos_token -}}
{%- if messages[0]['role'] == 'system' -%}
  {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- set loop_messages = messages[1:] -%}
{%- else -%}
  {%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
  {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
  {{- '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') -}}
  {{- message['content'] | trim -}}
  {{- '<end_of_turn>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%}
"""
GEMMA3_CONVERSATIONS = {
    **{name: turns for name, turns in CONVERSATIONS.items() if "reasoning" not in name},
    "contents with spaces and newlines around them": [
        ("system", "Answer in capitals."), ("user", "  Uppercase: c a t s\n"), ("assistant", "\nC A T S  "),
    ],
}  # fmt: skip


@pytest.fixture(scope="module")
def gemma3_path(tiny_gemma3):
    return inspect_model_dir(tiny_gemma3).tokenizer_paths["path"]


@pytest.fixture(scope="module")
def gemma3_rendered(gemma3_path):
    """Token ids of the documented template rendered as transformers renders chat templates (a sandboxed jinja2
    with trim_blocks and lstrip_blocks), encoded whole by the SentencePiece model: <bos> is a control token,
    which SentencePiece encodes only by id."""
    import sentencepiece
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    template = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(
        GEMMA3_TEMPLATE
    )
    spm = sentencepiece.SentencePieceProcessor(model_file=gemma3_path)

    def render(turns, **options):
        messages = [{"role": role, "content": content} for role, content in turns]
        return [spm.bos_id()] + spm.encode(template.render(messages=messages, bos_token="", **options))

    return render


@pytest.mark.parametrize("turns", GEMMA3_CONVERSATIONS.values(), ids=GEMMA3_CONVERSATIONS.keys())
def test_gemma3_tokenizes_a_conversation_as_its_chat_template_renders_it(turns, gemma3_path, gemma3_rendered):
    """Piece by piece, the same tokens as the rendered conversation encoded whole, then <eos> closing the example
    (as torchtune's Gemma tokenizer closes one)."""
    tokenizer = tokenizer_builders.gemma3_tokenizer(gemma3_path)
    tokens, mask = tokenizer.tokenize_messages(qwen3_messages(turns))
    assert tokens == gemma3_rendered(turns) + [tokenizer.eos_id]
    end_of_turn = len(tokens) - 1 - tokens[::-1].index(tokenizer.end_of_turn_id)
    assert mask[end_of_turn] is False  # the answer's end-of-turn token is trained


def test_the_tiny_kits_chat_template_renders_as_the_documented_one(tiny_gemma3, gemma3_rendered):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise ValueError(message)

    kit = json.loads((tiny_gemma3 / "tokenizer_config.json").read_text())["chat_template"]
    template = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(kit)
    template.globals["raise_exception"] = raise_exception
    documented = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(
        GEMMA3_TEMPLATE
    )
    for turns in GEMMA3_CONVERSATIONS.values():
        messages = [{"role": role, "content": content} for role, content in turns]
        for prompt in (True, False):
            assert template.render(messages=messages, bos_token="<bos>", add_generation_prompt=prompt) == (
                documented.render(messages=messages, bos_token="<bos>", add_generation_prompt=prompt)
            )


def test_gemma3_trains_every_assistant_turn_and_prompts_as_the_generation_prompt(
    gemma3_path, gemma3_rendered
):
    from kfp_finetune.components._shared.torchtune.evaluation import answer_start

    turns = CONVERSATIONS["two turns"]
    tokenizer = tokenizer_builders.gemma3_tokenizer(gemma3_path)
    messages = qwen3_messages(turns)
    tokens, mask = tokenizer.tokenize_messages(messages)
    trained = [token for token, masked in zip(tokens, mask, strict=True) if not masked]
    # Each assistant turn whole (header, answer, <end_of_turn> and its newline), as torchtune trains a turn.
    assert tokenizer.decode(trained) == (
        "<start_of_turn>model\nC A T S<end_of_turn>\n<start_of_turn>model\nD O G<end_of_turn>\n"
    )
    # Before the final answer's text: the template's generation prompt, which evaluation prompts with.
    prompt = gemma3_rendered(turns[:-1], add_generation_prompt=True)
    assert tokens[: len(prompt)] == prompt
    assert answer_start(tokenizer, messages, len(messages) - 1, tokens) == len(prompt)


def test_gemma3_keeps_a_system_prompt_masked_when_the_users_turn_is_trained(gemma3_path):
    """train_on_input unmasks the user's message; the system text opening that turn is its own message."""
    tokenizer = tokenizer_builders.gemma3_tokenizer(gemma3_path)
    turns = [
        Message("system", "Answer in capitals.", masked=True),
        Message("user", "Uppercase: c a t s", masked=False),
        Message("assistant", "C A T S", masked=False),
    ]
    tokens, mask = tokenizer.tokenize_messages(turns)
    masked = [token for token, masked in zip(tokens, mask, strict=True) if masked]
    assert tokenizer.decode(masked) == "Answer in capitals.\n\n"  # and the <bos> before it


def test_gemma3_stops_at_either_end_token_cuts_only_what_is_too_long_and_refuses_other_turns(gemma3_path):
    tokenizer = tokenizer_builders.gemma3_tokenizer(gemma3_path)
    assert set(tokenizer.stop_tokens) == {tokenizer.end_of_turn_id, tokenizer.eos_id}
    turns = qwen3_messages(CONVERSATIONS["one turn, no system prompt"])
    tokens, mask = tokenizer.tokenize_messages(turns)
    fits = tokenizer_builders.gemma3_tokenizer(gemma3_path, max_seq_len=len(tokens))
    assert fits.tokenize_messages(turns) == (tokens, mask)
    cut = tokenizer_builders.gemma3_tokenizer(gemma3_path, max_seq_len=len(tokens) - 2)
    assert cut.tokenize_messages(turns) == (
        tokens[: len(tokens) - 3] + [tokenizer.eos_id],
        mask[:-3] + [True],
    )
    with pytest.raises(ValueError, match="not 'ipython'"):
        tokenizer.tokenize_messages([Message("user", "hi"), Message("ipython", "{}")])
    with pytest.raises(ValueError, match="holds an image"):
        tokenizer.tokenize_messages([Message("user", [{"type": "image", "content": None}])])


def test_gemma3_refuses_a_tokenizer_model_without_its_turn_tokens(tmp_path):
    import sentencepiece

    from kfp_finetune.tiny.tokenizer import training_corpus

    plain = tmp_path / "tokenizer.model"
    with plain.open("wb") as out:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(training_corpus()), model_writer=out, vocab_size=150, minloglevel=2
        )
    with pytest.raises(ValueError, match="has no <start_of_turn> token: is it Gemma 3's tokenizer.model"):
        tokenizer_builders.gemma3_tokenizer(str(plain))
