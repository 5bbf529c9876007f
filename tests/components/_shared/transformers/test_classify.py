"""Sequence classification on the transformers engine (issue 28 item 4, the Training Operator v1 Hugging Face path):
the tiny BERT classifier (5 classes) trained on 3-class rows gets a new head named by the data's classes; the
LoRA run's merged folder is the base + adapter (head included), loadable with AutoModelForSequenceClassification;
the evaluation side tokenizes and scores the rows as training did."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from kfp_finetune.components._shared.errors import SettingError
from kfp_finetune.components._shared.transformers import classify, run_layout, train
from kfp_finetune.components._shared.transformers.settings import SftSettings
from kfp_finetune.tiny.reviews import review

pytest.importorskip("trl")
pytestmark = pytest.mark.slow

NAMES = ["negative", "neutral", "positive"]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def review_rows(count: int, seed: int = 0) -> list[dict]:
    """Reviews of three ratings (kfp_finetune/tiny/reviews.py's first three), labelled by class id."""
    rng = random.Random(seed)
    return [{"text": review(k, rng), "label": k} for k in (rng.randrange(3) for _ in range(count))]


def write_split(path, rows):
    import datasets

    features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=NAMES)}
    )
    datasets.Dataset.from_list(rows, features=features).to_parquet(str(path))
    return str(path)


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    from kfp_finetune.tiny.hf_models import build_tiny_hf_model

    root = tmp_path_factory.mktemp("classify")
    base = build_tiny_hf_model(root / "bert", "bert_classifier")
    return root, base, write_split(root / "train.parquet", review_rows(120))


def train_classifier(kit, method: str, steps: int, learning_rate: float) -> tuple:
    root, base, data = kit
    settings = SftSettings(
        model_dir=str(base), data_files=[data], output_dir=str(root / method), dataset_type="classification",
        data_style="classification", method=method, max_steps=steps, learning_rate=learning_rate, device="cpu",
    )  # fmt: skip
    return settings, train.train(settings)


def losses(run) -> list[float]:
    lines = (run / run_layout.METRICS_FILE).read_text().splitlines()
    return [float(line.split("loss:")[1].split()[0]) for line in lines]


@pytest.fixture(scope="module")
def full_run(kit):
    return train_classifier(kit, "full", 100, 3e-3)


def test_a_lora_classifier_gets_the_datas_classes_and_a_merged_folder_transformers_loads(kit):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    _, base, _ = kit
    settings, summary = train_classifier(kit, "lora", 10, 1e-2)
    run = Path(settings.output_dir)
    assert summary["global_step"] == 10 and set(summary) >= {"adapter_dir", "merged_dir"}
    resolved = json.loads((run / run_layout.RESOLVED_CONFIG).read_text())
    assert "training_arguments" in resolved and "sft_config" not in resolved  # transformers' own Trainer
    assert resolved["lora_config"]["task_type"] == "SEQ_CLS"
    assert {c["setting"]: c["value"] for c in resolved["choices"]}["packing"] is False
    assert classify.read_labels(run / "adapter") == NAMES

    merged = AutoModelForSequenceClassification.from_pretrained(run / "merged").eval()
    assert merged.config.id2label == dict(enumerate(NAMES)) and merged.num_labels == 3
    # The merge is the base with a head of the data's classes plus the adapter (the head trained in full).
    adapted = PeftModel.from_pretrained(classify.load_classifier(base, NAMES), str(run / "adapter")).eval()
    tokens = torch.randint(1, merged.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = merged(tokens).logits
        assert (adapted(tokens).logits - logits).abs().max().item() <= 1e-5
    # The same seed draws the same new head: a second run trains the same losses.
    again, _ = train_classifier((kit[0] / "again", *kit[1:]), "lora", 10, 1e-2)
    assert losses(Path(again.output_dir)) == losses(run)


def test_a_full_fine_tune_learns_the_classes_and_beats_its_base_on_held_out_rows(kit, full_run, tmp_path):
    import dataclasses

    import torch
    from transformers import AutoTokenizer

    _, base, _ = kit
    settings, _ = full_run
    trained = losses(Path(settings.output_dir))
    assert min(trained[-10:]) < trained[0] - 0.3, "the classifier learned"
    held_out = dataclasses.replace(
        settings,
        data_files=[write_split(tmp_path / "eval.parquet", review_rows(40, seed=1))],
        max_seq_len=128,
    )
    tokenizer = AutoTokenizer.from_pretrained(base)
    rows = classify.eval_rows(held_out, tokenizer)
    examples = classify.examples(rows, range(len(rows)))
    assert examples[0].reference in NAMES and examples[0].labels == [examples[0].class_id]
    assert examples[0].tokens == tokenizer(rows[0]["text"])["input_ids"] and examples[0].prompt_tokens is None

    def accuracy(folder):
        model = classify.load_classifier(folder, NAMES).eval()
        found = classify.score(model, examples, label="m", batch_size=8, pad_id=0, device=torch.device("cpu"))
        assert found.generations == [NAMES[p] for p in found.predictions] and found.loss_tokens == len(
            examples
        )
        return sum(p == e.class_id for p, e in zip(found.predictions, examples, strict=False)) / len(examples)

    assert accuracy(Path(settings.output_dir) / "merged") > accuracy(base) + 0.3


def test_a_review_longer_than_berts_positions_trains_cut_to_them_and_more_is_refused(kit, tmp_path):
    """BERT learned 512 positions: the max_seq_len chosen from reviews of 600 words stops there, with its reason,
    so they are cut there and train (uncut, BERT's embeddings fail at their batch); a longer max_seq_len set by
    the user is refused before anything is read."""
    from kfp_finetune.components._shared.errors import SettingError
    from kfp_finetune.components._shared.transformers import plan

    _, base, _ = kit
    rows = review_rows(10) + [{"text": "great food " * 300, "label": 2}] * 2  # one epoch of 3 batches: all
    data = write_split(tmp_path / "long.parquet", rows)
    step = {"dataset_type": "classification", "max_steps_per_epoch": 3, "batch_size": 4, "device": "cpu"}
    where = {"model_dir": base, "data_files": [data], "run_dir": tmp_path / "run"}
    settings = plan.sft_settings(step, **where, data_hints={"data_style": "classification"})
    summary = train.train(settings)
    assert summary["global_step"] >= 3
    resolved = json.loads((Path(settings.output_dir) / run_layout.RESOLVED_CONFIG).read_text())
    assert resolved["settings"]["max_seq_len"] == 512
    (choice,) = [c for c in resolved["choices"] if c["setting"] == "max_seq_len"]
    assert "capped at the model's 512 positions" in choice["reason"]
    with pytest.raises(
        SettingError, match="^tune_max_seq_len is 1024, more than the 512 positions the model has"
    ):
        plan.sft_settings({**step, "max_seq_len": 1024}, **where)


def test_packing_a_classifier_is_refused_by_its_setting(tmp_path):
    settings = SftSettings(model_dir="m", data_files=["t.parquet"], output_dir="r", dataset_type="classification",
                           packing=True)  # fmt: skip
    with pytest.raises(SettingError, match="^packing packs causal-LM sequences"):
        settings.check()
    pair = SftSettings(model_dir="m", data_files=["t.parquet"], output_dir="r", dataset_type="classification",
                       column_map={"text": "review", "text_pair": "reply"})  # fmt: skip
    pair.check()
    assert pair.column("text_pair") == "reply"


def test_a_classifier_counts_the_tokens_it_reads():
    import torch

    inputs = {"labels": torch.tensor([2, 0]), "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])}
    assert train.batch_tokens(inputs) == 7
    causal = {"labels": torch.tensor([[-100, 5, 6], [-100, -100, 7]]), "attention_mask": torch.ones(2, 3)}
    assert train.batch_tokens(causal) == 3


def test_a_classifier_step_is_its_mean_loss_over_the_accumulation_steps(kit, tmp_path):
    """A classifier's loss is its batch's mean: over 4 accumulation steps each micro-batch's step loss is a quarter
    of it (the logged loss, and the gradient clipping acts on, the mean), not 4x that as a loss summed over
    num_items_in_batch would be scaled."""
    import torch
    from transformers import Trainer

    root, base, data = kit
    settings = SftSettings(
        model_dir=str(base), data_files=[data], output_dir=str(tmp_path / "run"), dataset_type="classification",
        data_style="classification", method="lora", max_steps=1, batch_size=4, gradient_accumulation_steps=4,
        device="cpu", max_seq_len=128,
    )  # fmt: skip
    trainer = classify.build_trainer(settings, Trainer, [])
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    trainer.model.train()
    torch.manual_seed(0)  # the same dropout masks in both forwards
    mean = trainer.model(**batch).loss.item()
    trainer.current_gradient_accumulation_steps = 4  # what Trainer's loop sets before its micro-batches
    torch.manual_seed(0)
    step = trainer.training_step(trainer.model, batch, num_items_in_batch=torch.tensor(16)).item()
    assert step == pytest.approx(mean / 4, rel=1e-5)


def test_a_lora_classifier_trains_its_new_head_in_fp32_beside_a_bf16_base(kit, tmp_path):
    from transformers import Trainer

    root, base, data = kit
    settings = SftSettings(
        model_dir=str(base), data_files=[data], output_dir=str(tmp_path / "run"), dataset_type="classification",
        data_style="classification", method="lora", max_steps=1, device="cpu", bf16=True, max_seq_len=128,
    )  # fmt: skip
    model = classify.build_trainer(settings, Trainer, []).model
    trained = {name: p.dtype for name, p in model.named_parameters() if p.requires_grad}
    frozen = {p.dtype for p in model.parameters() if not p.requires_grad}
    assert any("modules_to_save" in name for name in trained) and frozen == {torch_dtype("bfloat16")}
    assert set(trained.values()) == {torch_dtype("float32")}


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def test_a_causal_lm_without_a_pad_token_pools_where_its_tokenizer_pads(tmp_path):
    """A causal LM's config.json often names no pad token and a list of end tokens (Llama 3 Instruct's): its
    classifier pads, and pools, with the id its tokenizer pads with."""
    from transformers import AutoTokenizer

    from kfp_finetune.tiny.hf_models import build_tiny_hf_model

    base = build_tiny_hf_model(tmp_path / "moe", "qwen3_moe")
    config = json.loads((base / "config.json").read_text())
    config.pop("pad_token_id")
    config["eos_token_id"] = [config["eos_token_id"], config["bos_token_id"]]
    (base / "config.json").write_text(json.dumps(config))
    model = classify.load_classifier(base, NAMES)
    tokenizer = classify.prepare_tokenizer(AutoTokenizer.from_pretrained(base))
    assert model.config.pad_token_id == tokenizer.pad_token_id is not None


def test_sentence_pairs_are_scored_with_their_segment_ids(kit, tmp_path):
    """BERT-style pair rows: evaluation passes the segment ids training collated (text 0, text_pair 1), so each
    row's eval loss is the model's on the row as it trained."""
    import datasets
    import torch
    import torch.nn.functional as F
    from transformers import AutoTokenizer

    root, base, _ = kit
    rows = [
        {"text": r["text"], "reply": "thanks for the review", "label": r["label"]} for r in review_rows(6)
    ]
    features = datasets.Features({"text": datasets.Value("string"), "reply": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=NAMES)})  # fmt: skip
    data = str(tmp_path / "pairs.parquet")
    datasets.Dataset.from_list(rows, features=features).to_parquet(data)
    settings = SftSettings(
        model_dir=str(base), data_files=[data], output_dir=str(tmp_path / "run"), dataset_type="classification",
        data_style="classification", column_map={"text_pair": "reply"}, device="cpu", max_seq_len=128,
    )  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(base)
    dataset = classify.eval_rows(settings, tokenizer)
    assert all(1 in item["token_type_ids"] for item in dataset)
    model = classify.load_classifier(base, NAMES).eval()
    found = classify.score(
        model, classify.examples(dataset, range(len(rows))), label="pairs", batch_size=4,
        pad_id=tokenizer.pad_token_id, device="cpu",
    )  # fmt: skip
    with torch.no_grad():
        expected = [
            F.cross_entropy(
                model(
                    **{k: torch.tensor([item[k]]) for k in ("input_ids", "attention_mask", "token_type_ids")}
                ).logits,
                torch.tensor([item["labels"]]),
            ).item()
            for item in dataset
        ]
    assert found.example_losses == pytest.approx(expected, abs=1e-5)
