"""The tiny transformers-native model folders (kfp_finetune.tiny.hf_models) the transformers / TRL engine tests use:
each loads with the Auto classes offline and computes, and the build is deterministic."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kfp_finetune import cli
from kfp_finetune.tiny.hf_models import BERT_LABELS, KINDS, build_tiny_hf_model

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

WEIGHTS = "model.safetensors"


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-hf-models")
    return {kind: build_tiny_hf_model(root / kind, kind) for kind in KINDS}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No hub access: the folders must be complete on their own."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def file_hashes(model_dir: Path) -> dict[str, str]:
    return {
        str(path.relative_to(model_dir)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(model_dir.rglob("*"))
        if path.is_file()
    }


def load(auto_class: str, model_dir: Path):
    import transformers

    return getattr(transformers, auto_class).from_pretrained(
        model_dir, local_files_only=True, trust_remote_code=False
    )


def test_qwen3_moe_loads_offline_with_routed_experts(hf_models):
    model_dir = hf_models["qwen3_moe"]
    tokenizer, model = load("AutoTokenizer", model_dir), load("AutoModelForCausalLM", model_dir)
    config = model.config
    assert type(model).__name__ == "Qwen3MoeForCausalLM"
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size) == (4, 2, 32)
    assert (config.hidden_size, config.num_hidden_layers, config.head_dim) == (64, 2, 16)
    assert not config.tie_word_embeddings and config.vocab_size >= len(tokenizer)
    params = dict(model.named_parameters())
    for layer in range(config.num_hidden_layers):
        assert params[f"model.layers.{layer}.mlp.gate.weight"].shape == (4, 64)  # the router
        assert params[f"model.layers.{layer}.mlp.experts.down_proj"].shape[0] == 4
    generation = json.loads((model_dir / "generation_config.json").read_text())
    im_end, endoftext = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert generation["eos_token_id"] == [im_end, endoftext] and generation["pad_token_id"] == endoftext
    assert tokenizer.eos_token_id == im_end and tokenizer.pad_token_id == endoftext

    batch = tokenizer.apply_chat_template(
        [{"role": "user", "content": "reverse abcd"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model(**batch, output_router_logits=True)
    assert out.logits.shape == (1, batch["input_ids"].shape[1], config.vocab_size)
    assert out.router_logits[0].shape[-1] == 4


def test_qwen3_moe_one_step_moves_the_experts(hf_models):
    model = load("AutoModelForCausalLM", hf_models["qwen3_moe"])
    experts = model.model.layers[0].mlp.experts.gate_up_proj
    router = model.model.layers[0].mlp.gate.weight
    before = experts.detach().clone(), router.detach().clone()
    ids = torch.arange(3, 35).unsqueeze(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    # Only the chosen experts get gradients; with 32 tokens and 2 of 4 per token, every expert is hit.
    moved = (experts.detach() - before[0]).abs().flatten(1).amax(dim=1)
    assert (moved > 0).all(), moved
    assert not torch.equal(router.detach(), before[1])


def test_gemma3_vlm_takes_an_image_through_its_processor(hf_models):
    from PIL import Image

    model_dir = hf_models["gemma3_vlm"]
    processor = load("AutoProcessor", model_dir)
    model = load("AutoModelForImageTextToText", model_dir)
    config = model.config
    assert type(model).__name__ == "Gemma3ForConditionalGeneration"
    assert (config.vision_config.image_size, config.vision_config.patch_size) == (32, 32 // 4)
    assert config.mm_tokens_per_image == 4  # 4x4 patches, average-pooled 2x2

    def inputs(image):
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}]
        prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return processor(text=prompt, images=image, return_tensors="pt", add_special_tokens=False)

    pixels = torch.Generator().manual_seed(0)
    image = Image.fromarray(torch.randint(0, 256, (32, 32, 3), generator=pixels, dtype=torch.uint8).numpy())
    batch = inputs(image)
    assert batch["pixel_values"].shape == (1, 3, 32, 32)
    ids = batch["input_ids"][0].tolist()
    assert ids.count(config.image_token_id) == config.mm_tokens_per_image
    assert ids.count(config.boi_token_id) == ids.count(config.eoi_token_id) == 1
    assert ids[0] == processor.tokenizer.bos_token_id and ids.count(ids[0]) == 1

    logits = model(**batch).logits
    assert logits.shape == (1, len(ids), config.text_config.vocab_size)
    # The image reaches the text: another image changes the last position's logits.
    other = model(**inputs(Image.new("RGB", (32, 32), (255, 0, 0)))).logits
    assert not torch.allclose(logits[0, -1], other[0, -1])


def test_gemma3_vlm_tokenizer_encodes_like_the_tiny_sentencepiece_model(hf_models, tmp_path):
    sentencepiece = pytest.importorskip("sentencepiece")
    from kfp_finetune.tiny.tokenizer import _write_gemma3_tokenizer, training_corpus

    _write_gemma3_tokenizer(tmp_path)
    reference = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "tokenizer.model"))
    tokenizer = load("AutoTokenizer", hf_models["gemma3_vlm"])
    texts = [
        *training_corpus()[:200:7],
        "Ünïcödé 😀 tabs\tand  spaces\n\nend",
        "<start_of_turn>user\nhi<end_of_turn>\n",
    ]
    for text in texts:
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == reference.encode(text), text
    image_tokens = ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]
    assert tokenizer.convert_tokens_to_ids(image_tokens) == [
        tokenizer.boi_token_id,
        tokenizer.eoi_token_id,
        tokenizer.image_token_id,
    ]
    assert min(tokenizer.convert_tokens_to_ids(image_tokens)) >= reference.get_piece_size()


def test_bert_classifier_scores_five_star_labels(hf_models):
    model_dir = hf_models["bert_classifier"]
    tokenizer = load("AutoTokenizer", model_dir)
    model = load("AutoModelForSequenceClassification", model_dir)
    assert type(model).__name__ == "BertForSequenceClassification"
    assert model.config.num_labels == 5
    assert [model.config.id2label[i] for i in range(5)] == list(BERT_LABELS)
    assert tokenizer.convert_tokens_to_ids(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]) == [0, 1, 2, 3, 4]

    batch = tokenizer(["The answer was great!", "hello"], padding=True, return_tensors="pt")
    tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][0])
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and "[UNK]" not in tokens
    assert "the" in tokens and "answer" in tokens  # lower-cased, corpus words whole
    assert model(**batch).logits.shape == (2, 5)


@pytest.mark.parametrize("kind", KINDS)
def test_build_is_deterministic(hf_models, kind, tmp_path):
    first = file_hashes(hf_models[kind])
    assert file_hashes(build_tiny_hf_model(tmp_path / "again", kind)) == first
    other_seed = file_hashes(build_tiny_hf_model(tmp_path / "seed1", kind, seed=1))
    assert other_seed.keys() == first.keys()
    assert {name for name in first if first[name] != other_seed[name]} == {WEIGHTS}


def test_unknown_kind_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown kind"):
        build_tiny_hf_model(tmp_path, "llava")


def test_cli_command(tmp_path, capsys):
    assert cli.main(["tiny-hf-model", str(tmp_path / "b"), "--kind", "bert_classifier", "--seed", "2"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "b")
    assert json.loads((tmp_path / "b" / "config.json").read_text())["model_type"] == "bert"
