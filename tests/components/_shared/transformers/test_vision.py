"""Vision-language fine-tuning on the transformers engine (issue 28 item 5): image + text chat rows as
dataset-initialize writes them (embedded images, one `<image>` tag per image) train the tiny Gemma 3 VLM with TRL's
vision collator; the LoRA run's merged folder is base + adapter and loads with AutoModelForImageTextToText; the
evaluation side collates each row as training did, so the pictures reach the model's loss and generations."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from kfp_finetune.components._shared.transformers import run_layout, train, vision
from kfp_finetune.components._shared.transformers.settings import SftSettings
from kfp_finetune.tiny.pictures import COLOURS, picture

pytest.importorskip("trl")

TAG = "<image>"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def test_turns_are_cut_into_text_and_image_parts_at_the_tag():
    row = {
        "messages": [
            {"role": "user", "content": "Compare <image> with <image>."},
            {"role": "assistant", "content": "Both red."},
        ],
        "images": ["kept as they are"],
    }
    parts = vision.with_image_parts(row, TAG)
    assert parts["messages"][0]["content"] == [
        {"type": "text", "text": "Compare "}, {"type": "image", "text": None},
        {"type": "text", "text": " with "}, {"type": "image", "text": None}, {"type": "text", "text": "."},
    ]  # fmt: skip
    assert parts["messages"][1]["content"] == [{"type": "text", "text": "Both red."}]
    assert parts["images"] == row["images"]
    # No tag: TRL puts the images before the first user turn's text itself.
    assert vision.with_image_parts(row, "") == row


def chat_rows(count: int, seed: int = 0) -> list[dict]:
    """Two-turn conversations about one picture each; every fifth row has no picture (a text-only row)."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        name = rng.choice(sorted(COLOURS))
        with_picture = i % 5 != 4
        question = f"{TAG}\nWhat colour is this?" if with_picture else "Say a colour."
        rows.append(
            {
                "messages": [
                    {"role": "user", "content": question},
                    {"role": "assistant", "content": name},
                ],
                "images": [{"bytes": picture(COLOURS[name], rng), "path": None}] if with_picture else [],
            }
        )
    return rows


def write_split(path, rows) -> str:
    import datasets

    turn = {"role": datasets.Value("string"), "content": datasets.Value("string")}
    features = datasets.Features({"messages": [turn], "images": datasets.Sequence(datasets.Image())})
    datasets.Dataset.from_list(rows, features=features).to_parquet(str(path))
    return str(path)


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    from kfp_finetune.tiny.hf_models import build_tiny_hf_model

    root = tmp_path_factory.mktemp("vision")
    base = build_tiny_hf_model(root / "vlm", "gemma3_vlm")
    return (
        root,
        base,
        write_split(root / "train.parquet", chat_rows(40)),
        write_split(root / "eval.parquet", chat_rows(10, 1)),
    )


@pytest.fixture(scope="module")
def lora_run(kit):
    root, base, data, _ = kit
    settings = SftSettings(
        model_dir=str(base), data_files=[data], output_dir=str(root / "lora"), dataset_type="multimodal",
        data_style="openai", max_steps=6, batch_size=4, learning_rate=2e-3, device="cpu",
    )  # fmt: skip
    return settings, train.train(settings)


@pytest.mark.slow
def test_a_lora_run_trains_on_the_pictures_and_its_merged_folder_is_base_plus_adapter(kit, lora_run):
    import torch
    from peft import PeftModel
    from safetensors import safe_open
    from transformers import AutoModelForImageTextToText

    _, base, _, _ = kit
    settings, summary = lora_run
    assert summary["global_step"] == 6
    resolved = json.loads((Path(settings.output_dir) / run_layout.RESOLVED_CONFIG).read_text())
    assert {c["setting"]: c["value"] for c in resolved["choices"]}["packing"] is False
    with safe_open(f"{summary['adapter_dir']}/{run_layout.ADAPTER_WEIGHTS}", "pt") as f:
        adapted = list(f.keys())
    assert any("vision_tower" in key for key in adapted) and any("language_model" in key for key in adapted)

    merged = AutoModelForImageTextToText.from_pretrained(summary["merged_dir"]).eval()
    reference = PeftModel.from_pretrained(
        AutoModelForImageTextToText.from_pretrained(base), summary["adapter_dir"]
    ).eval()
    dataset = vision.eval_rows(eval_settings(settings, kit), vision.load_processor(base))
    (example,) = vision.examples(dataset, [0])
    tokens = torch.tensor([example.tokens])
    with torch.no_grad():
        ours = vision.forward(merged, tokens, torch.ones_like(tokens), [example])
        theirs = vision.forward(reference, tokens, torch.ones_like(tokens), [example])
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def eval_settings(settings: SftSettings, kit) -> SftSettings:
    """The run's settings as it trained with them (trl_config.json), pointed at the eval rows."""
    resolved = json.loads((Path(settings.output_dir) / run_layout.RESOLVED_CONFIG).read_text())
    return dataclasses.replace(SftSettings.from_dict(resolved["settings"]), data_files=[kit[3]])


@pytest.mark.slow
def test_eval_rows_are_collated_as_training_collates_them_and_the_picture_reaches_the_model(kit, lora_run):
    import torch
    from transformers import AutoModelForImageTextToText

    _, base, _, _ = kit
    settings, summary = lora_run
    processor = vision.load_processor(base)
    dataset = vision.eval_rows(eval_settings(settings, kit), processor)
    assert len(dataset) == 10
    first, text_only = vision.examples(dataset, [0, 4])
    image_token = processor.tokenizer.convert_tokens_to_ids("<image_soft_token>")
    assert first.tokens.count(image_token) == 4  # the tiny model's 4 soft tokens for its one picture
    # The picture stands where its tag stood: the tag's text is gone from what the model reads.
    assert TAG not in processor.tokenizer.decode(first.tokens)
    assert first.model_inputs["pixel_values"].shape == (1, 3, 32, 32)
    assert text_only.tokens.count(image_token) == 0 and "pixel_values" not in text_only.model_inputs
    # Only the answer trains; the prompt to generate from ends where the answer begins.
    trained = [t for t, label in zip(first.tokens, first.labels, strict=True) if label != -100]
    assert processor.tokenizer.decode(trained).startswith(first.reference)
    assert first.tokens[len(first.prompt_tokens) :][: len(trained)] == trained
    assert first.prompt == "<image>\nWhat colour is this?"

    model = AutoModelForImageTextToText.from_pretrained(summary["merged_dir"]).eval()
    width = max(len(first.tokens), len(text_only.tokens))
    tokens = torch.tensor([e.tokens + [0] * (width - len(e.tokens)) for e in (first, text_only)])
    mask = torch.tensor([[1] * len(e.tokens) + [0] * (width - len(e.tokens)) for e in (first, text_only)])
    with torch.no_grad():
        logits = vision.forward(model, tokens, mask, [first, text_only])  # a picture and none in one batch
        other = dict(first.model_inputs, pixel_values=torch.zeros_like(first.model_inputs["pixel_values"]))
        blank = vision.forward(model, tokens[:1], mask[:1], [dataclasses.replace(first, model_inputs=other)])
    assert logits.shape[0] == 2
    answer_at = len(first.prompt_tokens) - 1
    assert not torch.allclose(logits[0, answer_at], blank[0, answer_at], atol=1e-4)  # the picture is read


def test_the_engine_serves_a_vision_language_model_only_for_image_rows(kit):
    from kfp_finetune.components._shared import engines

    _, base, _, _ = kit
    config = json.loads((base / "config.json").read_text())
    choice = engines.choose(base, config, engines.AUTO, engines.task_of("multimodal"))
    assert (choice.engine, choice.task) == ("transformers", "image-text-to-text")
    assert "Gemma3ForConditionalGeneration" in choice.reason
    with pytest.raises(
        Exception, match="torchtune's recipes train text generation only, not image-text-to-text"
    ):
        engines.choose(base, config, "torchtune", engines.task_of("multimodal"))


def test_a_processor_without_a_chat_template_is_refused_naming_the_folder(kit, tmp_path):
    import shutil

    _, base, _, _ = kit
    copy = shutil.copytree(base, tmp_path / "no-template")
    (copy / "chat_template.jinja").unlink()
    with pytest.raises(ValueError, match="processor has no chat template"):
        vision.load_processor(copy)


@pytest.mark.slow
def test_a_full_run_changes_the_language_model_and_the_vision_tower_and_saves_the_whole_model(kit):
    import torch
    from transformers import AutoModelForImageTextToText

    root, base, data, _ = kit
    settings = SftSettings(
        model_dir=str(base), data_files=[data], output_dir=str(root / "full"), dataset_type="multimodal",
        data_style="openai", method="full", max_steps=3, batch_size=4, learning_rate=1e-3, device="cpu",
    )  # fmt: skip
    summary = train.train(settings)
    tuned = AutoModelForImageTextToText.from_pretrained(summary["merged_dir"]).state_dict()
    before = AutoModelForImageTextToText.from_pretrained(base).state_dict()
    assert tuned.keys() == before.keys()
    changed = {name for name, weight in tuned.items() if not torch.equal(weight, before[name])}
    assert any("vision_tower" in name for name in changed) and any(
        "language_model" in name for name in changed
    )
    assert (Path(summary["merged_dir"]) / "processor_config.json").is_file()
