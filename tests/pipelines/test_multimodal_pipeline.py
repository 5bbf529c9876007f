"""KEP-2401's MultimodalDataset through `finetune_pipeline` under kfp.local (issue 28 item 5): a folder of pictures and
a JSON Lines file naming them (`images/`, one `<image>` tag per question) as data_type=multimodal, the project's
tiny Gemma 3 vision-language model, no engine named. The transformers engine trains it with TRL's vision collator,
evaluate scores both models on the held-out pictures (pixel values in), the gate passes on eval_loss beyond the
eval set's noise, and export writes a folder AutoModelForImageTextToText and AutoProcessor load and that answers
from the picture."""

import pytest

from kfp_finetune.pipelines.finetune import finetune_pipeline
from kfp_finetune.tiny.pictures import COLOURS, IMAGE_DIR, QUESTION, picture, write_pictures
from tests.pipelines.test_pipelines import FAST_TRAINING, run_locally

pytest.importorskip("trl")


@pytest.mark.slow
def test_a_vision_language_model_fine_tunes_on_pictures_through_the_pipeline(tmp_path):
    import io
    import random

    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from kfp_finetune.tiny.hf_models import build_tiny_hf_model

    base_dir = build_tiny_hf_model(tmp_path / "vlm", "gemma3_vlm")
    destination = tmp_path / "exported"
    settings = {
        **FAST_TRAINING,
        "tune_max_steps_per_epoch": 40,
        "eval_max_samples": 0,
        "data_eval_fraction": 0.25,
    }
    task = run_locally(
        tmp_path, finetune_pipeline, model_uri=str(base_dir), data_uri=str(write_pictures(tmp_path / "pictures")),
        data_type="multimodal", data_image_dir=IMAGE_DIR, export_destination=str(destination), **settings,
    )  # fmt: skip
    outputs = task.outputs
    model = outputs["model"].metadata
    assert (model["engine"], model["task"]) == ("transformers", "image-text-to-text")
    evaluation = outputs["eval_metrics"].metadata
    assert outputs["passed"] is True and evaluation["num_samples"] == 30
    assert evaluation["tuned_eval_loss"] < evaluation["base_eval_loss"]
    assert evaluation["eval_loss_improvement_ci_low"] > 0

    exported = AutoModelForImageTextToText.from_pretrained(destination).eval()
    processor = AutoProcessor.from_pretrained(destination)
    rng, right = random.Random(7), 0
    for name, rgb in COLOURS.items():
        image = Image.open(io.BytesIO(picture(rgb, rng))).convert("RGB")
        text = QUESTION.replace("<image>", "")
        messages = [
            {"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": text}]}
        ]
        inputs = processor.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
        )
        with torch.no_grad():
            output = exported.generate(**inputs, max_new_tokens=4, do_sample=False)
        answer = processor.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        right += answer.strip().startswith(name)
    assert right >= 3, right  # the exported model reads the colour from the picture
    card = (destination / "README.md").read_text()
    assert "pipeline_tag: image-text-to-text" in card and "with TRL on transformers" in card
    assert "| learning rate |" in card  # the hyperparameters trl_config.json recorded
    assert "AutoModelForImageTextToText.from_pretrained" in card
