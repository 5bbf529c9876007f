"""The transformers engine's fast defaults (fast.py): what an auto setting becomes on each kind of hardware, the
memory model against sizes measured on GPUs, and an explicit setting left alone."""

from __future__ import annotations

import pytest

from kfp_finetune.components._shared.transformers import fast
from kfp_finetune.components._shared.transformers.fast import GIB, Hardware, ModelSize
from kfp_finetune.components._shared.transformers.settings import SftSettings

CPU = Hardware(cuda=False)
H100 = Hardware(cuda=True, gpu_bytes=80 * GIB, flash_attention=True, liger=True)
H200 = Hardware(cuda=True, gpu_bytes=140 * GIB, flash_attention=True, liger=False)
BARE_GPU = Hardware(cuda=True, gpu_bytes=80 * GIB)
# Llama-3.1-8B's and Llama-3.2-1B's dimensions (their config.json files) and parameter counts.
LLAMA_8B = ModelSize(parameters=8_030_261_248, hidden=4096, layers=32, vocab=128_256)
LLAMA_1B = ModelSize(parameters=1_235_814_400, hidden=2048, layers=16, vocab=128_256)


def settings(**changes) -> SftSettings:
    return SftSettings(model_dir="/nowhere", data_files=["t.parquet"], output_dir="/tmp/run", **changes)


def chosen(
    settings_: SftSettings, hardware: Hardware, model: ModelSize | None = None, world: int = 1
) -> dict:
    return {c.setting: c.value for c in fast.choose(settings_, hardware, model, world)}


def test_on_the_cpu_rows_are_grouped_by_length_and_nothing_gpu_only_is_chosen():
    found = fast.choose(settings(), CPU)
    assert {c.setting: c.value for c in found} == {
        "packing": False,
        "train_sampling_strategy": "group_by_length",
        "liger_kernel": False,
        "gradient_checkpointing": False,
    }
    assert all(c.reason for c in found) and "no GPU" in found[0].reason


def test_a_gpu_with_flash_attention_packs_padding_free_and_liger_is_used_where_installed():
    on_h100 = chosen(settings(batch_size=4, max_seq_len=2048), H100, LLAMA_1B)
    assert on_h100["packing"] is True and "train_sampling_strategy" not in on_h100
    assert on_h100["liger_kernel"] is True
    bare = fast.choose(settings(batch_size=4, max_seq_len=2048), BARE_GPU, LLAMA_1B)
    by_setting = {c.setting: c for c in bare}
    assert by_setting["packing"].value is False and "flash-attn" in by_setting["packing"].reason
    assert by_setting["train_sampling_strategy"].value == "group_by_length"
    assert by_setting["liger_kernel"].value is False and "not installed" in by_setting["liger_kernel"].reason


def test_before_max_seq_len_is_chosen_from_the_rows_checkpointing_waits_for_it():
    """The node pod's check builds TRL's arguments before the training process measured the rows."""
    (choice,) = [c for c in fast.choose(settings(), H100, LLAMA_8B) if c.setting == "gradient_checkpointing"]
    assert choice.value is True and "until max_seq_len and the micro-batch are chosen" in choice.reason


@pytest.mark.parametrize(
    ("method", "model", "tokens", "hardware", "checkpointing"),
    [
        # 8B LoRA at 16k tokens per micro-batch trains without checkpointing on an H200 (RESULTS.md §10b: 94-101
        # GiB measured) and not on an 80 GiB GPU; 1B LoRA fits an 80 GiB GPU; a full 8B (128 GB of weights,
        # gradients and Adam state on one GPU) never fits: checkpointing is no cure, but it is the least wrong.
        ("lora", LLAMA_8B, 4 * 4096, H200, False),
        ("lora", LLAMA_8B, 4 * 4096, BARE_GPU, True),
        ("lora", LLAMA_1B, 8 * 2048, BARE_GPU, False),
        ("full", LLAMA_8B, 1 * 2048, H200, True),
    ],
)
def test_checkpointing_is_on_only_where_the_memory_model_says_the_run_does_not_fit(
    method, model, tokens, hardware, checkpointing
):
    run = settings(method=method, batch_size=tokens // 2048, max_seq_len=2048)
    (choice,) = [c for c in fast.choose(run, hardware, model) if c.setting == "gradient_checkpointing"]
    assert choice.value is checkpointing, choice.reason
    assert f"{tokens} tokens per micro-batch" in choice.reason


def test_the_memory_model_counts_what_checkpointing_and_liger_save():
    tokens = 16_384
    plain = fast.training_bytes("lora", LLAMA_8B, tokens, checkpointing=False, liger=False)
    assert 95 * GIB < plain < 105 * GIB  # the H200 runs above measured 94-101 GiB at 16k tokens
    assert fast.training_bytes("lora", LLAMA_8B, tokens, checkpointing=True, liger=False) < plain / 2
    assert plain - fast.training_bytes("lora", LLAMA_8B, tokens, checkpointing=False, liger=True) == (
        tokens * LLAMA_8B.vocab * fast.LOGIT_BYTES
    )


def test_an_explicit_setting_is_never_chosen_over():
    assert (
        chosen(settings(packing=False, liger_kernel=True, gradient_checkpointing=True), H100, LLAMA_8B) == {}
    )


@pytest.mark.parametrize(
    ("method", "model", "world", "sharded"),
    [
        # A full 8B needs 128 GB of weights, gradients and Adam state per replica: sharded over 8 GPUs, 16 GB
        # each. An 8B LoRA replica (a 16 GB bf16 base) fits one GPU, so DDP moves only the adapter's gradients.
        ("full", LLAMA_8B, 8, True),
        ("lora", LLAMA_8B, 8, False),
        ("full", LLAMA_1B, 2, False),
        ("qlora", LLAMA_8B, 8, False),
    ],
)
def test_several_gpus_shard_the_model_with_fsdp2_only_where_one_cannot_hold_a_replica(
    method, model, world, sharded
):
    run = settings(method=method, batch_size=2, max_seq_len=2048)
    by_setting = {c.setting: c for c in fast.choose(run, H100, model, world)}
    assert by_setting["fsdp"].value is sharded, by_setting["fsdp"].reason
    expected = {True: "FSDP2 shards", False: "QLoRA" if method == "qlora" else "data-parallel (DDP)"}[sharded]
    assert expected in by_setting["fsdp"].reason
    if (
        sharded
    ):  # the memory model then counts one GPU's shard: 16 GB of state and the activations fit an H100
        checkpointing = by_setting["gradient_checkpointing"]
        assert checkpointing.value is False and f"sharded over {world} GPUs" in checkpointing.reason


def test_one_process_or_the_cpu_shards_nothing():
    assert "fsdp" not in chosen(settings(method="full", max_seq_len=2048), H100, LLAMA_8B, world=1)
    (choice,) = [c for c in fast.choose(settings(method="full"), CPU, None, 4) if c.setting == "fsdp"]
    assert choice.value is False and "CPU" in choice.reason
    assert fast.needs_model(settings(gradient_checkpointing=False), H100, 8)
    assert not fast.needs_model(settings(gradient_checkpointing=False), H100, 1)
    assert not fast.needs_model(settings(), CPU, 8)
    assert "fsdp" not in chosen(settings(method="full", fsdp=False), H100, LLAMA_8B, world=8)


@pytest.mark.parametrize(
    ("method", "model", "seq", "hardware", "rows", "why"),
    [
        # 1B LoRA: 16k tokens fit an H100 without checkpointing (Liger: no logits kept), as 32 rows of 512.
        ("lora", LLAMA_1B, 512, H100, 32, "8-16k tokens keep the GPU busy"),
        # 8B LoRA at 4096 on an 80 GiB GPU without Liger: 16k tokens do not fit, 8k (2 rows) do.
        ("lora", LLAMA_8B, 4096, BARE_GPU, 2, "8-16k tokens keep the GPU busy"),
        # A 40 GiB GPU: one 2048-token row of 8B LoRA fits without checkpointing, down at the 8B's busy floor.
        ("lora", LLAMA_8B, 2048, Hardware(cuda=True, gpu_bytes=40 * GIB), 1, "the most that fits without"),
        # A 6 GiB GPU with Liger: not even the 1B's busy floor (4096 tokens) fits without checkpointing, 16k
        # tokens fit with it.
        ("lora", LLAMA_1B, 2048, Hardware(cuda=True, gpu_bytes=6 * GIB, liger=True), 8, "with activation"),
        # A full 8B on one GPU fits no micro-batch: the least, said to be over.
        ("full", LLAMA_8B, 2048, H100, 1, "OVER the GPU"),
    ],
)
def test_on_a_gpu_the_micro_batch_holds_8_to_16k_tokens_within_the_gpu(
    method, model, seq, hardware, rows, why
):
    choice = fast.choose_batch(settings(method=method, max_seq_len=seq), hardware, model)
    assert choice.value == rows and why in choice.reason, choice.reason
    # The checkpointing the memory model chooses for that micro-batch agrees with the reason.
    run = settings(method=method, max_seq_len=seq, batch_size=rows)
    (checkpointing,) = [c for c in fast.choose(run, hardware, model) if c.setting == "gradient_checkpointing"]
    assert checkpointing.value is (why in ("with activation", "OVER the GPU"))


def test_the_cpu_and_image_rows_train_the_planned_micro_batch():
    assert fast.choose_batch(settings(max_seq_len=512), CPU, None).value == fast.PLANNED_BATCH
    image_rows = settings(max_seq_len=2048, dataset_type="multimodal")
    assert fast.choose_batch(image_rows, H100, LLAMA_1B).value == fast.PLANNED_BATCH
    # Checkpointing the user turned on: the micro-batch is planned with it.
    with_it = fast.choose_batch(settings(max_seq_len=2048, gradient_checkpointing=True), BARE_GPU, LLAMA_8B)
    assert with_it.value == 8


def test_the_model_size_is_read_from_the_folder_as_transformers_counts_it(tmp_path):
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from kfp_finetune.tiny.hf_models import build_tiny_hf_model

    folder = build_tiny_hf_model(tmp_path / "moe", "qwen3_moe")
    size = ModelSize.of(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert size.parameters == sum(p.numel() for p in model.parameters())
    assert (size.hidden, size.layers, size.vocab) == (
        model.config.hidden_size,
        model.config.num_hidden_layers,
        model.config.vocab_size,
    )


def test_the_training_process_applies_the_choices_and_records_them():
    pytest.importorskip("trl")
    sft, _ = settings(device="cpu").trl_config()
    assert sft.train_sampling_strategy == "group_by_length" and sft.packing is False
    assert sft.use_liger_kernel is False and sft.gradient_checkpointing is False
    recorded = settings(device="cpu").resolved()["choices"]
    assert [c["setting"] for c in recorded] == [
        "packing",
        "train_sampling_strategy",
        "liger_kernel",
        "gradient_checkpointing",
    ]
