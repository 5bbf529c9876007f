"""A model torchtune cannot serve fine-tunes through `finetune_pipeline` under kfp.local with no engine named
(issue 28): the tiny Qwen3-MoE (built by the project, random weights) trains with LoRA and full on the transformers
engine, evaluate scores it against its base, the gate passes, and export writes a folder transformers loads — the
merged weights, and for LoRA the PEFT adapter that gives the same logits on the base."""

import pytest

from kfp_finetune.components._shared.images import TRANSFORMERS_TRAINER_IMAGE
from kfp_finetune.pipelines.finetune import finetune_pipeline
from tests.pipelines.test_pipelines import FAST_TRAINING, run_locally

pytest.importorskip("trl")


@pytest.mark.slow
@pytest.mark.parametrize("method", ["lora", "full"])
def test_a_mixture_of_experts_fine_tunes_through_the_pipeline_with_no_engine_named(
    method, tiny_dataset, tmp_path
):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from kfp_finetune.tiny.hf_models import build_tiny_hf_model

    base_dir = build_tiny_hf_model(tmp_path / "moe", "qwen3_moe")
    destination = tmp_path / "exported"
    task = run_locally(
        tmp_path, finetune_pipeline, model_uri=str(base_dir), data_uri=str(tiny_dataset["train.jsonl"]),
        export_destination=str(destination), tune_method=method, export_format="both" if method == "lora" else "merged",
        **FAST_TRAINING,
    )  # fmt: skip
    outputs = task.outputs
    assert outputs["model"].metadata["engine"] == "transformers"
    assert outputs["model_image"] == TRANSFORMERS_TRAINER_IMAGE  # evaluate ran there on a cluster
    assert outputs["passed"] is True and outputs["train_metrics"].metadata["steps"] == 12
    evaluation = outputs["eval_metrics"].metadata
    assert evaluation["tuned_eval_loss"] < evaluation["base_eval_loss"]

    merged = AutoModelForCausalLM.from_pretrained(destination, dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    tokens = torch.randint(0, merged.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = merged(tokens).logits
        assert (base(tokens).logits - logits).abs().max().item() > 1e-3, "the export is the tuned model"
        if method == "lora":
            adapted = PeftModel.from_pretrained(base, destination / "adapter").eval()
            assert (adapted(tokens).logits - logits).abs().max().item() <= 1e-4
