"""The tokenizer.json tokenizer (hf_tokenizer.py): token ids equal to `tokenizers`' and transformers' own encoding of
the repo's tokenizer.json on varied text; each family's conversations tokenized as transformers renders the family's
documented chat template (written here, not taken from a hub file), masked and stopped as training and generation
need, cut as torchtune cuts. Tiny tokenizer.json files built offline (kfp_finetune.tiny, and richer ones here)."""

import inspect
import json
import shutil

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from torchtune.data import Message
from transformers import AutoTokenizer

from kfp_finetune.components._shared.torchtune import hf_tokenizer
from kfp_finetune.components._shared.torchtune.model_inspection import (
    FAMILIES,
    inspect_model_dir,
    instantiate,
)
from kfp_finetune.tiny.tokenizer import LLAMA3_PATTERN

FAMILY_NAMES = ["smollm2", "mistral_nemo"]
DIGITS = "digits 0 7 42 123 2024 3.14159 1,000,000 12345678901234567890"
TEXTS = [
    "Hello, world!",
    "Uppercase: c a t s",
    "naïve café résumé — “quotes” ‘single’ …",
    "東京タワー 北京 서울 Привет мир",
    "emoji 🤖🚀, a flag 🇫🇷 and a joined 👩‍💻",
    DIGITS,
    "whitespace  runs   of\t\ttabs\n\n\nnewlines \n \n and trailing   ",
    "   leading spaces",
    "",
    "CamelCase iPhone NaOH pH eBay HTTPServer",
    "contractions: don't I'll we're they've She'd",
    "def f(x):\n    return x**2  # comment\r\n",
    "special tokens in text: <|im_start|>user\nhi<|im_end|> [INST] x [/INST] </s> <s>",
    "\u00a0no-break space, \u200b zero width",
]


@pytest.fixture(scope="module")
def model_dirs(tiny_smollm2, tiny_mistral_nemo):
    return {"smollm2": tiny_smollm2, "mistral_nemo": tiny_mistral_nemo}


@pytest.fixture(scope="module")
def rich_dirs(model_dirs, tmp_path_factory):
    """The kit's tokenizer folders with a BPE trained on TEXTS with merges across every boundary (spaces, digit runs,
    case changes, newlines): the family's pre-tokenizer then decides the ids, so a tokenizer that pre-tokenized
    otherwise would encode otherwise (test_the_texts_show_a_pre_tokenizer_mismatch)."""
    folders = {}
    for family, kit in model_dirs.items():
        spec = json.loads((kit / "tokenizer.json").read_text())
        specials = [t["content"] for t in spec["added_tokens"]]
        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        trainer = trainers.BpeTrainer(
            vocab_size=3000, special_tokens=specials, show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )  # fmt: skip
        bpe.train_from_iterator(TEXTS * 20, trainer=trainer)
        spec["model"] = json.loads(bpe.to_str())["model"]
        folder = tmp_path_factory.mktemp("rich") / family
        shutil.copytree(kit, folder, ignore=shutil.ignore_patterns("*.safetensors"))
        (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
        folders[family] = folder
    return folders


def ours(folder, family, **settings):
    return getattr(hf_tokenizer, f"{family}_tokenizer")(str(folder / "tokenizer.json"), **settings)


@pytest.mark.parametrize("merges", ["kit", "rich"])
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_token_ids_equal_tokenizers_and_transformers_encoding(family, merges, model_dirs, rich_dirs):
    folder = (model_dirs if merges == "kit" else rich_dirs)[family]
    tokenizer = ours(folder, family)
    library = Tokenizer.from_file(str(folder / "tokenizer.json"))
    transformers_tokenizer = AutoTokenizer.from_pretrained(folder)
    for text in TEXTS:
        ids = tokenizer.encode(text, add_bos=False, add_eos=False)
        assert ids == library.encode(text, add_special_tokens=False).ids, text
        assert ids == transformers_tokenizer(text, add_special_tokens=False)["input_ids"], text
        # With the post-processor: Mistral-Nemo's tokenizer.json opens with <s>, SmolLM2's adds nothing.
        assert tokenizer.encode(text, add_eos=False) == transformers_tokenizer(text)["input_ids"], text
        assert tokenizer.decode(ids) == text
        assert tokenizer.decode(ids, skip_special_tokens=True) == transformers_tokenizer.decode(
            ids, skip_special_tokens=True
        )


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_the_texts_show_a_pre_tokenizer_mismatch(family, rich_dirs):
    """Without the family's first pre-tokenizer step (SmolLM2: single digits; Tekken: its Split), the same merges
    give other ids on these texts: the equality above would catch a tokenizer that skipped it."""
    spec = json.loads((rich_dirs[family] / "tokenizer.json").read_text())
    expected = Tokenizer.from_str(json.dumps(spec))
    spec["pre_tokenizer"] = spec["pre_tokenizer"]["pretokenizers"][1]
    spec["pre_tokenizer"]["use_regex"] = True  # GPT-2's byte-level split alone
    mismatched = Tokenizer.from_str(json.dumps(spec))
    differ = [t for t in TEXTS if expected.encode(t).ids != mismatched.encode(t).ids]
    assert DIGITS in differ  # both split digit runs into single digits; GPT-2's keeps them whole


def transformers_fix_mistral_regex(folder):
    """The tokenizer.json in folder as transformers corrects it (a private helper: from_pretrained applies it only
    to vocabularies above 100,000 tokens; its signature changed between 4.57 and 5)."""
    from transformers import PreTrainedTokenizerFast

    patch = PreTrainedTokenizerFast._patch_mistral_regex
    if "is_local" in inspect.signature(patch).parameters:  # transformers 5 patches a tokenizers.Tokenizer
        return patch(Tokenizer.from_file(str(folder / "tokenizer.json")), str(folder), is_local=True,
                     fix_mistral_regex=True)  # fmt: skip
    fast = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    return patch(fast, str(folder), _is_local=True, fix_mistral_regex=True).backend_tokenizer


def test_a_mistral_tokenizer_json_with_llama_3s_split_is_read_with_tekkens(rich_dirs, tmp_path):
    """A tokenizer.json saved by transformers before 5.0 may split with Llama 3's regex (digits in threes, letters
    not by case): read as transformers reads it with fix_mistral_regex=True (its own correction, which it applies
    to vocabularies above 100,000 tokens: Tekken's 131,072, not this tiny one's), not as the file is written."""
    from transformers import PreTrainedTokenizerFast

    if not hasattr(PreTrainedTokenizerFast, "_patch_mistral_regex"):
        pytest.skip("this transformers has no fix_mistral_regex")
    folder = shutil.copytree(rich_dirs["mistral_nemo"], tmp_path / "saved-by-transformers-4")
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": LLAMA3_PATTERN}
    (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "transformers_version": "4.43.0.dev0"}))
    tokenizer = ours(folder, "mistral_nemo")
    fixed = transformers_fix_mistral_regex(folder)
    as_written = Tokenizer.from_file(str(folder / "tokenizer.json"))
    differ = []
    for text in TEXTS:
        ids = tokenizer.encode(text, add_bos=False, add_eos=False)
        assert ids == fixed.encode(text, add_special_tokens=False).ids, text
        if ids != as_written.encode(text, add_special_tokens=False).ids:
            differ.append(text)
    assert DIGITS in differ and "CamelCase iPhone NaOH pH eBay HTTPServer" in differ


# --- the chat formats, against each family's documented template -----------------------------------------------

# SmolLM2-Instruct's chat template (its model card and tokenizer_config.json): ChatML turns; a conversation whose
# first message is no system message gets SmolLM2's default system prompt.
SMOLLM2_TEMPLATE = """
{%- for message in messages -%}
  {%- if loop.first and messages[0]['role'] != 'system' -%}
    {{- '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' -}}
  {%- endif -%}
  {{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""
# Mistral-Nemo-Instruct-2407's format (Tekken; Mistral's tokenization guide): <s>, then [INST]user[/INST] and
# assistant</s> with no whitespace around the control tokens; a system prompt and a blank line open the last user
# message. A prompt ends with [/INST].
MISTRAL_NEMO_TEMPLATE = """
{%- set system = messages | selectattr('role', 'equalto', 'system') | list -%}
{%- set users = messages | selectattr('role', 'equalto', 'user') | list -%}
{{- bos_token -}}
{%- for message in messages -%}
  {%- if message['role'] == 'user' -%}
    {%- if system and message is sameas users[-1] -%}
      {{- '[INST]' + system[0]['content'] + '\n\n' + message['content'] + '[/INST]' -}}
    {%- else -%}
      {{- '[INST]' + message['content'] + '[/INST]' -}}
    {%- endif -%}
  {%- elif message['role'] == 'assistant' -%}
    {{- message['content'] + eos_token -}}
  {%- endif -%}
{%- endfor -%}
"""
TEMPLATES = {"smollm2": SMOLLM2_TEMPLATE, "mistral_nemo": MISTRAL_NEMO_TEMPLATE}
# The text a template writes after the final answer's end token, which an example does not end with.
AFTER_END = {"smollm2": "\n", "mistral_nemo": ""}
CONVERSATIONS = {
    "one turn, with a system prompt": [
        ("system", "Answer in capitals."), ("user", "Uppercase: c a t s"), ("assistant", "C A T S"),
    ],
    "one turn, no system prompt": [("user", "Uppercase: c a t s"), ("assistant", "C A T S")],
    "two turns": [
        ("user", "Uppercase: c a t s"), ("assistant", "C A T S"), ("user", "Uppercase: d o g"), ("assistant", "D O G"),
    ],
    "two turns, with a system prompt": [
        ("system", "Answer in capitals."), ("user", "Uppercase: c a t s"), ("assistant", "C A T S"),
        ("user", "Uppercase: d o g"), ("assistant", "D O G"),
    ],
    "whitespace, digits and unicode": [
        ("user", "  Count:\n\n1 22 333\tcafé 東京 🤖 "), ("assistant", " 4444 \n done\n"),
    ],
}  # fmt: skip


@pytest.fixture(scope="module")
def render(model_dirs):
    """Token ids of the family's documented template as transformers renders and tokenizes it."""
    tokenizers = {family: AutoTokenizer.from_pretrained(folder) for family, folder in model_dirs.items()}

    def rendered(family, turns, **options):
        tokenizer = tokenizers[family]
        messages = [{"role": role, "content": content} for role, content in turns]
        text = tokenizer.apply_chat_template(
            messages,
            chat_template=TEMPLATES[family],
            tokenize=False,
            bos_token="<s>",
            eos_token="</s>",
            **options,
        )
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    return rendered


def messages_of(turns, train_on_input=False):
    return [
        Message(role, content, masked=role != "assistant" and not train_on_input) for role, content in turns
    ]


def family_tokenizer(model_dir, **settings):
    """As a run builds it: the family's tokenizer node from the model folder."""
    node = {**inspect_model_dir(model_dir).tokenizer_node(None), **settings}
    return instantiate(node)


@pytest.mark.parametrize("turns", CONVERSATIONS.values(), ids=CONVERSATIONS.keys())
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_a_conversation_is_tokenized_as_transformers_renders_the_familys_template(
    family, turns, model_dirs, render
):
    tokenizer = family_tokenizer(model_dirs[family])
    tokens, mask = tokenizer.tokenize_messages(messages_of(turns))
    expected = render(family, turns)
    after_end = len(tokenizer.encode(AFTER_END[family], add_bos=False, add_eos=False))
    assert tokens == expected[: len(expected) - after_end]
    assert tokens[-1] == tokenizer.eos_id and mask[-1] is False  # the answer's end token is trained


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_assistant_turns_are_trained_whole_and_the_prompt_before_the_answer_is_the_generation_prompt(
    family, model_dirs, render
):
    turns = CONVERSATIONS["two turns, with a system prompt"]
    tokenizer = family_tokenizer(model_dirs[family])
    tokens, mask = tokenizer.tokenize_messages(messages_of(turns))
    trained = tokenizer.decode([t for t, masked in zip(tokens, mask, strict=True) if not masked])
    # Each assistant turn with its opening and end token (and, before the next turn, what follows it).
    assert (
        trained
        == {
            "smollm2": "<|im_start|>assistant\nC A T S<|im_end|>\n<|im_start|>assistant\nD O G<|im_end|>",
            "mistral_nemo": "C A T S</s>D O G</s>",
        }[family]
    )
    prompt = render(family, turns[:-1], add_generation_prompt=True)
    assert tokens[: len(prompt)] == prompt
    assert tokenizer.decode(tokens[len(prompt) :]) == "D O G" + hf_tokenizer.CHAT_FORMATS[family].end
    # train_on_input: every token trained; the default system prompt (SmolLM2) is the format's, not data: masked.
    tokens_all, mask_all = tokenizer.tokenize_messages(messages_of(turns, train_on_input=True))
    assert tokens_all == tokens and not any(mask_all[1:])


def test_smollm2s_default_system_prompt_opens_a_conversation_whose_first_message_is_no_system_message(
    model_dirs, render
):
    turns = [("user", "Uppercase: c a t s"), ("system", "Answer in capitals."), ("assistant", "C A T S")]
    tokens, _ = family_tokenizer(model_dirs["smollm2"]).tokenize_messages(messages_of(turns))
    assert tokens == render("smollm2", turns)[:-1]


def test_smollm2s_default_system_prompt_is_masked_even_with_train_on_input(model_dirs):
    tokenizer = family_tokenizer(model_dirs["smollm2"])
    turns = CONVERSATIONS["one turn, no system prompt"]
    tokens, mask = tokenizer.tokenize_messages(messages_of(turns, train_on_input=True))
    masked = tokenizer.decode([t for t, m in zip(tokens, mask, strict=True) if m])
    assert masked == f"<|im_start|>system\n{hf_tokenizer.CHAT_FORMATS['smollm2'].default_system}<|im_end|>\n"


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_an_example_that_fits_is_tokenized_as_without_max_seq_len_and_a_longer_one_is_cut_as_torchtune_cuts(
    family, model_dirs
):
    turns = messages_of(CONVERSATIONS["two turns"])
    tokens, mask = family_tokenizer(model_dirs[family]).tokenize_messages(turns)
    for max_seq_len in (len(tokens), len(tokens) + 1, 4096):
        tokenizer = family_tokenizer(model_dirs[family], max_seq_len=max_seq_len)
        assert tokenizer.tokenize_messages(turns) == (tokens, mask)
    for max_seq_len in (len(tokens) - 1, 5):
        tokenizer = family_tokenizer(model_dirs[family], max_seq_len=max_seq_len)
        # torchtune's cut: the first max_seq_len - 1 tokens as they were, then the end token, masked.
        assert tokenizer.tokenize_messages(turns) == (
            tokens[: max_seq_len - 1] + [tokenizer.eos_id],
            mask[: max_seq_len - 1] + [True],
        )
        sample = tokenizer({"messages": turns})  # torchtune's transform; datasets read max_seq_len to pack
        assert len(sample["tokens"]) == len(sample["mask"]) == max_seq_len == tokenizer.max_seq_len


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_stop_pad_and_text_completion_tokens(family, model_dirs):
    tokenizer = family_tokenizer(model_dirs[family])
    added = tokenizer.special_tokens
    stop, pad, bos = {
        "smollm2": ({"<|im_end|>", "<|endoftext|>"}, "<|endoftext|>", None),
        "mistral_nemo": ({"</s>"}, "<unk>", "<s>"),
    }[family]
    assert set(tokenizer.stop_tokens) == {added[t] for t in stop}
    assert tokenizer.pad_id == added[pad] and tokenizer.bos_id == (added[bos] if bos else None)
    # Text data (text_completion_dataset): the format's BOS, the text, the end token.
    text = tokenizer.encode("C A T S", add_bos=False, add_eos=False)
    assert tokenizer.encode("C A T S") == ([added[bos]] if bos else []) + text + [tokenizer.eos_id]
    # Without add_eos a final answer ends with its text (a prompt to continue), as torchtune's tokenizers do.
    turns = messages_of(CONVERSATIONS["one turn, no system prompt"])
    with_eos, _ = tokenizer.tokenize_messages(turns)
    without, _ = tokenizer.tokenize_messages(turns, add_eos=False)
    assert without == with_eos[:-1]


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_tool_turns_and_a_foreign_tokenizer_json_are_refused(family, model_dirs, tiny_llama):
    tokenizer = family_tokenizer(model_dirs[family])
    with pytest.raises(ValueError, match="has no 'ipython' turns"):
        tokenizer.tokenize_messages([Message("user", "f?"), Message("ipython", "42")])
    with pytest.raises(
        ValueError, match=r"tokenizer.json has no added token .*is this the family's tokenizer.json"
    ):
        ours(tiny_llama, family)


def test_a_token_used_by_id_only_may_be_a_plain_vocabulary_entry_but_one_written_in_text_must_be_added(
    model_dirs, tmp_path
):
    """<unk> (Mistral-Nemo's padding) is only inserted by id; [INST] is written in the turns' text, where only an
    added token is split out whole."""
    folder = shutil.copytree(
        model_dirs["mistral_nemo"], tmp_path / "nemo", ignore=shutil.ignore_patterns("*.safetensors")
    )
    spec = json.loads((folder / "tokenizer.json").read_text())
    unk_id = spec["model"]["vocab"]["<unk>"]
    added = spec["added_tokens"]
    spec["added_tokens"] = [t for t in added if t["content"] != "<unk>"]
    (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    assert ours(folder, "mistral_nemo").pad_id == unk_id
    spec["added_tokens"] = [t for t in added if t["content"] != "[INST]"]
    (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    with pytest.raises(ValueError, match=r"has no added token \[INST\], which Mistral-Nemo's"):
        ours(folder, "mistral_nemo")


def test_each_family_reading_a_tokenizer_json_has_one_chat_format():
    json_families = {name for name, f in FAMILIES.items() if f.tokenizer.startswith(hf_tokenizer.__name__)}
    assert json_families == set(hf_tokenizer.CHAT_FORMATS) == set(FAMILY_NAMES)
    for name in json_families:
        assert FAMILIES[name].tokenizer == f"{hf_tokenizer.__name__}.{name}_tokenizer"
        chat_format = hf_tokenizer.CHAT_FORMATS[name]
        assert chat_format.turns["assistant"][1].startswith(chat_format.end)
