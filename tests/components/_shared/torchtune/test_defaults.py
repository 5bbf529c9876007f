"""Defaults chosen from the data, the model and the hardware (defaults.py): what they choose, why, and that every
user setting wins. GPU behaviour is checked through the resolved config (no GPU here)."""

import math
from types import SimpleNamespace

import pytest

from kfp_finetune.commands import resolve_config
from kfp_finetune.components._shared.errors import ConfigError, SettingError
from kfp_finetune.components._shared.torchtune import flex_attention, lr_schedule
from kfp_finetune.components._shared.torchtune.choices import Choice
from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig
from kfp_finetune.components._shared.torchtune.defaults import TokenLengths, busy_floor_tokens
from kfp_finetune.components._shared.torchtune.memory_model import estimate_memory, gpu_memory_from_product
from kfp_finetune.components._shared.torchtune.model_inspection import FAMILIES, inspect_model_dir
from kfp_finetune.components._shared.torchtune.resolve import resolve_run
from kfp_finetune.components._shared.torchtune.torch_checks import validate_config
from tests.components._shared.torchtune.test_resolve import fake_model_dir, resolve

# Rows of 300-700 tokens, one in a hundred 3000: the p99 is 700 -> max_seq_len 768, not the outlier's length.
LENGTHS = TokenLengths([300 + (i % 400) for i in range(990)] + [3000] * 10, num_rows=50_000, how="the test")
GPU_FAMILIES = ["llama3_1", "llama3_2", "qwen2_5", "mistral", "gemma", "gemma2", "phi3"]
# torchtune 0.6.1's Gemma 2 attention refuses the BlockMask packed batches get on CUDA ("Block masks are not
# implemeted yet, use packed=False", torchtune/models/gemma2/_attention.py): GPU runs of it train unpacked.
UNPACKED_ON_GPU = {"gemma2"}
PACKED_GPU_FAMILIES = [family for family in GPU_FAMILIES if family not in UNPACKED_ON_GPU]


def on_gpu(model_dir, tmp_path, lengths=LENGTHS, gpu_memory_gib=None, **settings):
    settings.setdefault("device", "cuda")
    return resolve(
        model_dir, tmp_path / "data.jsonl", tmp_path, validate=False, token_lengths=lengths,
        gpu_memory_gib=gpu_memory_gib, **settings,
    )  # fmt: skip


@pytest.fixture
def data(tmp_path):
    (tmp_path / "data.jsonl").write_text('{"input": "a", "output": "b"}\n')


def chosen(run) -> dict:
    return {c.setting: c for c in run.defaults}


@pytest.mark.parametrize("method", ["lora", "full"])
@pytest.mark.parametrize("family", GPU_FAMILIES)
def test_gpu_runs_pack_compile_and_decide_checkpointing_from_a_memory_estimate(
    family, method, tmp_path, data
):
    run = on_gpu(fake_model_dir(tmp_path, family), tmp_path, method=method)
    c = run.config
    assert c["dataset"]["packed"] is (family not in UNPACKED_ON_GPU)
    if family in UNPACKED_ON_GPU:  # one row per sample, cut at the same length; why: in the log and report
        packed = chosen(run)["packed"]
        assert packed.value is False and "gemma2 attention takes no block masks" in packed.reason
        assert "flex_attention" not in chosen(run)
        family_builders = (FAMILIES[family].builder, FAMILIES[family].lora_builder)
        assert c["model"]["_component_"] in family_builders  # not flex_attention's builder over it
    assert c["tokenizer"]["max_seq_len"] == 768  # p99 700 rounded up to 256, the 3000-token outliers cut
    assert c["compile"] is True
    assert isinstance(c["enable_activation_checkpointing"], bool)
    reason = chosen(run)["enable_activation_checkpointing"].reason
    assert "params" in reason and "activations" in reason and "GiB per GPU" in reason
    # 8-16k tokens; less, down to the model's floor, only where that spares activation checkpointing (issue 27's
    # cliff) or where the base config's global batch is smaller (issue 27: the floor scales with the model).
    tokens, floor = c["batch_size"] * 768, busy_floor_tokens(run.model)
    batch_reason = chosen(run)["batch_size"].reason
    assert (
        min(floor, 8192 // 768 * 768) <= tokens <= 16384
    )  # the floor never passes the busy 8k, rounded down
    assert (
        tokens >= 8192
        or not c["enable_activation_checkpointing"]
        or "share the base config's" in batch_reason
    ), batch_reason
    if method == "lora":  # gemma has no single-device full config: another family's is used
        assert run.config_name.split("/")[0] == family


@pytest.mark.parametrize("family", PACKED_GPU_FAMILIES)
def test_packed_gpu_runs_compile_flex_attention_without_dynamic_false(family, tmp_path, data):
    """On CUDA, packed batches go through flex attention: the model node names our builder over the family's, which
    compiles flex attention as torchtune main does (flex_attention.py), and the reason is a Choice."""
    model_dir = fake_model_dir(tmp_path, family)
    run = on_gpu(model_dir, tmp_path, method="lora", compile=False)
    unpacked = on_gpu(model_dir, tmp_path, method="lora", packed=False)
    model = run.config["model"]
    assert (model["_component_"], model["builder"]) == (
        flex_attention.COMPONENT,
        unpacked.config["model"]["_component_"],
    )
    # the family builder's arguments, where the recipe reads them (model.lora_rank ...)
    assert flex_attention.unwrap(model) == unpacked.config["model"]
    choice = chosen(run)["flex_attention"]
    assert choice.value == flex_attention.COMPILED == "torch.compile(flex_attention) without dynamic=False"
    assert "dynamic=False" in choice.reason and "PR 2765" in choice.reason
    assert "flex_attention" not in chosen(unpacked)
    # torchtune's validation binds the family builder's arguments through our node
    validate_config(run.config)
    with pytest.raises(ConfigError, match="lora_rnk"):
        validate_config({**run.config, "model": {**model, "lora_rnk": 8}})


@pytest.mark.parametrize(
    "settings",
    [{"packed": True, "max_seq_len": 768}, {"overrides": {"dataset.packed": True}}],
    ids=["typed", "override"],
)
def test_packing_a_family_whose_attention_takes_no_block_masks_is_refused_on_cuda(settings, tmp_path, data):
    """Set by the user for Gemma 2 on CUDA, packing would fail at the first step inside torchtune: refused now, in
    one line naming the setting and the fix. On CPU packed batches get a tensor mask, which it takes."""
    model_dir = fake_model_dir(tmp_path, "gemma2")
    with pytest.raises(SettingError, match=r"^packed cannot be on for a gemma2 model on CUDA: ") as refused:
        on_gpu(model_dir, tmp_path, method="lora", **settings)
    message = str(refused.value)
    assert refused.value.setting == "packed" and "\n" not in message
    assert "takes no block masks" in message and "set tune_packed=false" in message
    on_cpu = on_gpu(model_dir, tmp_path, method="lora", device="cpu", **settings)
    assert on_cpu.config["dataset"]["packed"] is True


def test_flex_attention_is_ours_only_on_cuda_and_not_over_a_model_builder_the_user_names(tmp_path, data):
    model_dir = fake_model_dir(tmp_path, "llama3_2")
    builder = "torchtune.models.llama3_2.lora_llama3_2"
    on_cpu = on_gpu(model_dir, tmp_path, device="cpu", packed=True, max_seq_len=768)
    assert on_cpu.config["dataset"]["packed"] is True and on_cpu.config["model"]["_component_"] == builder
    named = on_gpu(model_dir, tmp_path, overrides={"model._component_": builder})
    assert named.config["dataset"]["packed"] is True and named.config["model"]["_component_"] == builder
    assert "flex_attention" not in chosen(named)


def test_resolve_config_cli_previews_a_cuda_run_here(tiny_llama, tiny_dataset, capsys, log_lines):
    """The real rows, a full fine-tune whose base config names bitsandbytes (absent); a preview imports no torch, so
    the token lengths are estimated from characters, and the output says so."""
    for method in ("lora", "full"):
        parser = __import__("argparse").ArgumentParser()
        resolve_config.add_arguments(parser)
        args = parser.parse_args(
            ["--model-dir", str(tiny_llama), "--data", str(tiny_dataset["train.jsonl"]), "--device", "cuda",
             "--method", method]
        )  # fmt: skip
        assert resolve_config.run(args) == 0
        out = capsys.readouterr().out
        assert "packed: true" in out and "compile: true" in out
        assert "# default enable_activation_checkpointing = False: not needed: params" in out
        assert "# default max_seq_len = " in out and "estimated from characters" in out
    assert any("default packed = True" in line for line in log_lines)


def test_memory_model_matches_hand_computed_values_for_llama3_8b(tmp_path):
    model = inspect_model_dir(fake_model_dir(tmp_path, "llama3"))
    gib = 1024**3
    # Llama-3-8B: dim 4096, 32 layers, q 4096, kv 8x128=1024, intermediate 14336, vocab 128256, untied.
    params = 32 * (4096 * 128 * (2 * 32 + 2 * 8) + 3 * 4096 * 14336) + 128256 * 4096 * 2
    assert model.num_parameters == params == 8_029_995_008  # norms (266k) left out
    lora = {
        "lora_rank": 8,
        "lora_attn_modules": ["q_proj", "v_proj", "output_proj"],
        "apply_lora_to_mlp": True,
    }
    adapter = 32 * (8 * (4096 + 4096) + 8 * (4096 + 1024) + 8 * (4096 + 4096) + 3 * 8 * (4096 + 14336))
    per_token_layer = 4 * 4096 + 3 * 4096 + 2 * 1024 + 4 * 14336  # = 88064 elements
    logits = 128256 * 6

    lora_run = estimate_memory(model, "lora", lora, "bf16", "torch.optim.AdamW", world=1, tokens=8192)
    assert lora_run.trained_parameters == adapter == 19_660_800
    assert lora_run.parameters == pytest.approx((params + adapter) * 2 / gib)
    assert lora_run.gradients == pytest.approx(adapter * 2 / gib)
    assert lora_run.optimizer == pytest.approx(adapter * 8 / gib)
    assert lora_run.activations == pytest.approx(8192 * (32 * per_token_layer * 2 + logits) / gib)
    assert lora_run.activations == pytest.approx(48.87, abs=0.01)
    assert lora_run.activations_checkpointed == pytest.approx(
        8192 * (32 * 4096 * 2 + per_token_layer * 2 + logits) / gib
    )

    full_8 = estimate_memory(model, "full", None, "bf16", "torch.optim.AdamW", world=8, tokens=8192)
    assert full_8.parameters == pytest.approx(params * 2 / 8 / gib)  # FSDP shards over the 8 GPUs
    assert full_8.optimizer == pytest.approx(params * 8 / 8 / gib)  # two fp32 moments
    assert full_8.fixed == pytest.approx(params * 12 / 8 / gib) == pytest.approx(11.22, abs=0.01)

    qlora = estimate_memory(model, "qlora", lora, "bf16", "torch.optim.AdamW", world=1, tokens=8192)
    linear = 32 * (4096 * 128 * 80 + 3 * 4096 * 14336)
    assert qlora.parameters == pytest.approx((linear * 0.5 + (params - linear) * 2 + adapter * 2) / gib)
    paged = estimate_memory(model, "full", None, "bf16", "bitsandbytes.optim.PagedAdamW8bit", 1, 8192)
    assert paged.optimizer == pytest.approx(params * 2 / gib)
    # torchtune's chunked cross-entropy upcasts one of its 8 output chunks at a time (issue 27: the logits term was
    # 2-3x too high for it): vocab x (2 + 4 / 8) bytes a token instead of vocab x 6.
    chunked = estimate_memory(
        model, "lora", lora, "bf16", "torch.optim.AdamW", world=1, tokens=8192, loss_chunks=8
    )
    assert chunked.activations == pytest.approx(8192 * (32 * per_token_layer * 2 + 128256 * 2.5) / gib)


def test_checkpointing_and_offloading_only_when_the_memory_needs_them(tmp_path, data):
    model_dir = fake_model_dir(tmp_path, "llama3_1")
    roomy = on_gpu(model_dir, tmp_path, method="lora", gpu_memory_gib=141)
    assert roomy.config["enable_activation_checkpointing"] is False
    # The busy 8k rounded down to whole 768-token packs (the base config's global batch allows no 16k).
    assert roomy.config["batch_size"] * 768 == 7680
    # 40 GiB: a 3 072-token micro-batch still fits unchecked (8B's floor is 2 048 tokens); 32 GiB: none does.
    smaller = on_gpu(model_dir, tmp_path, method="lora", gpu_memory_gib=40)
    assert (smaller.config["batch_size"] * 768, smaller.config["enable_activation_checkpointing"]) == (
        3072,
        False,
    )
    tight = on_gpu(model_dir, tmp_path, method="lora", gpu_memory_gib=32)
    assert tight.config["enable_activation_checkpointing"] is True
    assert tight.config["enable_activation_offloading"] is False
    assert "needed: params" in chosen(tight)["enable_activation_checkpointing"].reason
    tiny = on_gpu(
        model_dir, tmp_path, method="full", gpu_memory_gib=40
    )  # 8B full on one 40 GiB GPU: cannot fit
    assert tiny.config["enable_activation_offloading"] is True
    assert "OVER" in chosen(tiny)["enable_activation_checkpointing"].reason


def test_user_settings_win_over_every_default(tmp_path, data):
    model_dir = fake_model_dir(tmp_path, "llama3_1")
    typed = on_gpu(
        model_dir, tmp_path, method="lora", packed=False, max_seq_len=1024, compile=False, batch_size=3,
        gradient_accumulation_steps=5, enable_activation_checkpointing=True, enable_activation_offloading=True,
        num_warmup_steps=50, lora={"lora_rank": 16, "lora_alpha": 7.0},
    )  # fmt: skip
    c = typed.config
    assert (c["dataset"]["packed"], c["tokenizer"]["max_seq_len"], c["compile"], c["batch_size"]) == (
        False, 1024, False, 3)  # fmt: skip
    assert (c["gradient_accumulation_steps"], c["enable_activation_checkpointing"]) == (5, True)
    assert (c["enable_activation_offloading"], c["lr_scheduler"]["num_warmup_steps"]) == (True, 50)
    assert c["model"]["lora_alpha"] == 7.0
    # Only what the user left unset: torchtune's cosine becomes ours (no first step at lr 0), and the adapter run
    # saves only its adapter (merged after training, off the GPUs).
    assert [choice.setting for choice in typed.defaults] == ["lr_scheduler", "save_adapter_weights_only"]
    overridden = on_gpu(
        model_dir, tmp_path, method="lora",
        overrides={"dataset.packed": False, "tokenizer.max_seq_len": 512, "compile": False, "batch_size": 2,
                   "gradient_accumulation_steps": 4, "enable_activation_checkpointing": True,
                   "enable_activation_offloading": False, "lr_scheduler.num_warmup_steps": 7},
    )  # fmt: skip
    c = overridden.config
    assert (c["dataset"]["packed"], c["tokenizer"]["max_seq_len"], c["compile"], c["batch_size"]) == (
        False, 512, False, 2)  # fmt: skip
    assert (c["gradient_accumulation_steps"], c["enable_activation_checkpointing"]) == (4, True)
    assert c["lr_scheduler"]["num_warmup_steps"] == 7
    assert [choice.setting for choice in overridden.defaults] == ["lr_scheduler", "save_adapter_weights_only"]


def test_warmup_is_capped_at_five_percent_of_the_planned_steps(tmp_path, data):
    small = TokenLengths([500] * 100, num_rows=20_000, how="the test")  # 20k x 500 tokens = 10M tokens

    def planned(c):
        per_step = c["batch_size"] * c["gradient_accumulation_steps"]
        return (20_000 * 500 // 512 + 1) // per_step * c["epochs"]

    run = on_gpu(fake_model_dir(tmp_path, "llama3_2"), tmp_path, lengths=small, method="lora")
    c = run.config
    assert c["lr_scheduler"]["num_warmup_steps"] == planned(c) * 5 // 100 < 100  # the base config's 100
    assert "5% of the" in chosen(run)["num_warmup_steps"].reason
    full = on_gpu(fake_model_dir(tmp_path / "f", "llama3_2"), tmp_path, lengths=small, method="full")
    assert full.config["lr_scheduler"]["_component_"] == lr_schedule.COMPONENT
    assert 1 <= full.config["lr_scheduler"]["num_warmup_steps"] <= 0.05 * planned(full.config)


@pytest.mark.slow
def test_lora_alpha_keeps_the_base_ratio_when_only_the_rank_changes(tiny_llama, tiny_dataset, tmp_path):
    run = resolve(tiny_llama, tiny_dataset["train.jsonl"], tmp_path, method="lora", lora={"lora_rank": 32})
    assert run.config_name == "llama3_2/1B_lora_single_device"  # base rank 64, alpha 128
    assert run.config["model"]["lora_alpha"] == 64.0
    same = resolve(tiny_llama, tiny_dataset["train.jsonl"], tmp_path, method="lora", lora={"lora_rank": 64})
    assert same.config["model"]["lora_alpha"] == 128 and "lora_alpha" not in chosen(same)
    assert "max_seq_len" in chosen(same)  # the tokenizer cuts rows (seq_len.py)


def test_accumulation_keeps_the_global_batch_as_devices_grow(tmp_path, data):
    model_dir = fake_model_dir(tmp_path, "llama3_1")
    long_rows = TokenLengths(
        [4000] * 100, num_rows=10_000, how="the test"
    )  # 4096-token packs, 2-4 per micro-batch
    one = on_gpu(model_dir, tmp_path, lengths=long_rows, method="lora", gpu_memory_gib=141)
    eight = on_gpu(model_dir, tmp_path, lengths=long_rows, method="lora", gpu_memory_gib=141, devices=8)
    assert one.config["gradient_accumulation_steps"] > 1

    def global_tokens(run, world):
        c = run.config
        return c["batch_size"] * c["gradient_accumulation_steps"] * c["tokenizer"]["max_seq_len"] * world

    assert eight.config["gradient_accumulation_steps"] < one.config["gradient_accumulation_steps"]
    assert global_tokens(eight, 8) <= 2 * global_tokens(one, 1)  # not 8x


def test_the_micro_batch_is_no_larger_than_the_gpus_share_of_the_base_global_batch(tmp_path, data):
    """Accumulation cannot go below 1: a 16k micro-batch on each of 8 GPUs would make the global batch many times
    the base config's, so the micro-batch shrinks to each GPU's share of it, down to the model's floor, and the
    reason says how much larger the global batch still is; where the base's batch is large enough, 16k stays. The
    base config's global batch counts the devices its header names (issue 27)."""
    model_dir = fake_model_dir(tmp_path, "llama3_2")
    rows = TokenLengths([500] * 100, num_rows=20_000, how="the test")  # 512-token packs
    # llama3_2/1B_lora: batch 4 x accumulation 8, written for `--nproc_per_node 2`; 500-token rows.
    base_tokens = 4 * 8 * 500 * 2
    eight = on_gpu(model_dir, tmp_path, lengths=rows, method="lora", devices=8)
    c = eight.config
    # Each of 8 GPUs' share, with the accepted growth: 1.5 x 32,000 / 8 = 6,000 tokens -> 11 whole 512-token packs.
    assert (c["batch_size"] * 512, c["gradient_accumulation_steps"]) == (11 * 512, 1)
    assert "keeps the base config's ~32,000 tokens" in chosen(eight)["gradient_accumulation_steps"].reason
    assert "not 8-16k: 8 GPU(s) share the base config's ~32,000 tokens" in chosen(eight)["batch_size"].reason
    # On 16 GPUs the share (3,000) is below what keeps a 1B model busy: its floor, 4,096 tokens (2^23 / 2048).
    sixteen = on_gpu(model_dir, tmp_path, lengths=rows, method="lora", devices=16)
    c = sixteen.config
    assert (c["batch_size"] * 512, c["gradient_accumulation_steps"]) == (4096, 1)
    reason = chosen(sixteen)["gradient_accumulation_steps"].reason
    assert f"the global batch is {16 * 4096:,} tokens, {16 * 4096 / base_tokens:.1f}x the base's" in reason
    assert (
        "at least 4,096 tokens keep a 2048-wide model's matmuls busy" in chosen(sixteen)["batch_size"].reason
    )
    one = on_gpu(model_dir, tmp_path, lengths=rows, method="lora")
    # One GPU: the single-device base config (batch 4 x accumulation 8, no --nproc_per_node: 16,000 tokens).
    assert (one.config["batch_size"] * 512, one.config["gradient_accumulation_steps"]) == (16384, 1)
    assert "keeps the base config's ~16,000 tokens" in chosen(one)["gradient_accumulation_steps"].reason


def test_the_micro_batch_floor_scales_with_the_models_width(tmp_path):
    from kfp_finetune.components._shared.torchtune.defaults import busy_floor_tokens

    widths = {2048: 4096, 4096: 2048, 8192: 1024, 512: 8192, 16384: 1024}  # 2^23 / width within [1024, 8192]
    for width, floor in widths.items():
        model = SimpleNamespace(hf_config={"hidden_size": width})
        assert busy_floor_tokens(model) == floor, width


def test_gpu_memory_from_the_product_label():
    assert gpu_memory_from_product("NVIDIA-H100-80GB-HBM3") == 80
    assert gpu_memory_from_product("NVIDIA-H200") == 141
    assert gpu_memory_from_product("NVIDIA-A100-SXM4-40GB") == 40
    assert gpu_memory_from_product("NVIDIA-L4") == 24
    assert gpu_memory_from_product("something-else") is None


def test_an_override_of_a_whole_node_wins_over_the_defaults_inside_it(tmp_path, data):
    scheduler = {"_component_": "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup",
                 "num_warmup_steps": 100}  # fmt: skip
    run = on_gpu(
        fake_model_dir(tmp_path, "llama3_2"), tmp_path, method="lora", overrides={"lr_scheduler": scheduler}
    )
    assert run.config["lr_scheduler"]["num_warmup_steps"] == 100
    assert "num_warmup_steps" not in chosen(run)


@pytest.mark.slow
def test_the_local_backend_samples_lengths_with_the_training_tokenizer(tiny_llama, tiny_dataset, tmp_path):
    """Where torch is at hand (the local backend), the sample is tokenized exactly as training does: the lengths are
    those of torchtune's own dataset rows, not a character estimate."""
    from omegaconf import OmegaConf
    from torchtune import config as torchtune_config

    from kfp_finetune.components._shared.torchtune.defaults import sample_token_lengths

    run = resolve_run(
        TorchtuneConfig(method="lora"), tiny_llama, tiny_dataset["train.jsonl"], tmp_path / "run", write=False
    )
    sampled = sample_token_lengths(run.config, rows=50, seed=1)
    estimated = sample_token_lengths(run.config, rows=50, seed=1, tokenize=False)
    tokenizer = torchtune_config.instantiate(
        OmegaConf.create({**run.config["tokenizer"], "max_seq_len": None})
    )
    dataset = torchtune_config.instantiate(
        OmegaConf.create({**run.config["dataset"], "packed": False}), tokenizer
    )
    assert "random sample of 50" in sampled.how and "characters" in estimated.how
    picked = sorted(__import__("random").Random(1).sample(range(len(dataset)), 50))
    assert sampled.lengths == [len(dataset[i]["tokens"]) for i in picked]
    assert sampled.lengths != estimated.lengths


def test_each_default_reaches_the_report_and_the_train_config_metadata(tmp_path, data):
    from kfp_finetune.components._shared.contract import TrainConfig
    from kfp_finetune.components._shared.metrics_file import StepMetrics
    from kfp_finetune.components.torchtune_finetune.finetune import train_config_metadata
    from kfp_finetune.components.torchtune_finetune.report import torchtune_report

    run = on_gpu(fake_model_dir(tmp_path, "llama3_2"), tmp_path, method="lora")
    assert {"packed", "compile", "enable_activation_checkpointing"} <= set(chosen(run))

    metadata = train_config_metadata(run, ["torchtune_config.yaml"])
    assert metadata["defaults"] == [
        {"setting": c.setting, "value": c.value, "reason": c.reason, "warning": c.warning}
        for c in run.defaults
    ]
    assert TrainConfig.from_metadata(metadata, input_name="train_config").to_metadata() == metadata

    steps = [StepMetrics(step=1, values={"loss": 1.0, "lr": 1e-4})]
    model = {"method": "lora", "base_model": "m", "dataset_source": "d"}
    html = torchtune_report(run, steps, {"final_loss": 1.0}, model)
    section = html[html.index("Defaults chosen") :]
    for c in run.defaults:
        assert c.setting in section and html_escape(c.reason) in section
    assert "Warnings" not in html
    run.defaults = []
    assert "Defaults chosen" not in torchtune_report(run, steps, {"final_loss": 1.0}, model)
    # A warning about the user's own settings comes first, apart from the defaults.
    run.defaults = [Choice("optimizer steps", 3, "fewer than 20: raise tune_epochs", warning=True)]
    html = torchtune_report(run, steps, {"final_loss": 1.0}, model)
    assert "Defaults chosen" not in html and html.index("Warnings") < html.index("Curves")
    assert "fewer than 20: raise tune_epochs" in html


def html_escape(text: str) -> str:
    import html

    return html.escape(text)


def test_planned_steps_count_packs_and_every_device(tmp_path, data):
    """The progress estimate and the warmup cap use one count: 50k rows of ~500 tokens in 768-token packs,
    over 8 GPUs, not 50k rows over one."""
    from kfp_finetune.components._shared.torchtune.run_length import planned_steps

    run = on_gpu(fake_model_dir(tmp_path, "llama3_2"), tmp_path, method="lora", devices=8)
    c = run.config
    packs = math.ceil(50_000 * (sum(LENGTHS.lengths) / len(LENGTHS.lengths)) / 768)
    per_device = c["batch_size"] * c["gradient_accumulation_steps"]
    assert run.world == 8 and run.token_lengths is LENGTHS
    # As torchtune counts: each GPU's share of the packs (drop_last), over micro-batch and accumulation.
    expected = math.ceil(packs / 8) // c["batch_size"] // c["gradient_accumulation_steps"] * c["epochs"]
    assert planned_steps(c, run.world, run.token_lengths, num_rows=50_000) == expected
    unpacked = {**c, "dataset": {**c["dataset"], "packed": False}}
    assert planned_steps(unpacked, 1, None, num_rows=1000) == 1000 // per_device * c["epochs"]
    assert planned_steps(c, 8, None, num_rows=1000) is None  # packed, lengths unknown: no guess
    assert planned_steps({**c, "max_steps_per_epoch": 7}, 8, None, num_rows=None) == 7 * c["epochs"]


def test_gpu_memory_from_the_task_placement_an_explicit_value_or_80(tmp_path, data):
    """What the step passes to the memory model: the H200 a node selector (or required affinity) names, the
    explicit gpu_memory_gib over it, and nothing named: the assumed 80 GiB, said so."""
    from kfp import dsl

    from kfp_finetune.components.torchtune_finetune.backends.trainjob.manifest import (
        trainjob_spec_from_task_config,
    )
    from kfp_finetune.components.torchtune_finetune.gpu_memory import gpu_memory_for

    def memory(requested, **task_config):
        pod = trainjob_spec_from_task_config(dsl.TaskConfig(**task_config))
        return gpu_memory_for(requested, pod.node_selector, pod.affinity)

    h200 = {"nvidia.com/gpu.product": "NVIDIA-H200", "pool": "training"}
    assert memory(-1.0, node_selector=h200) == 141
    assert memory(40.0, node_selector=h200) == 40
    assert memory(-1.0) is None and memory(None, node_selector={"pool": "training"}) is None
    term = {
        "key": "nvidia.com/gpu.product",
        "operator": "In",
        "values": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"],
    }
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [term]}]}}}  # fmt: skip
    assert memory(-1.0, affinity=affinity) == 80  # the smaller of the two it may land on

    model_dir = fake_model_dir(tmp_path, "llama3_1")
    reason = chosen(
        on_gpu(model_dir, tmp_path, method="full", gpu_memory_gib=memory(-1.0, node_selector=h200))
    )
    assert "on a 141 GiB GPU" in reason["enable_activation_checkpointing"].reason
    unset = chosen(on_gpu(model_dir, tmp_path, method="full", gpu_memory_gib=memory(-1.0)))
    assert (
        "on a 80 GiB GPU (assumed: gpu_memory_gib unset)" in unset["enable_activation_checkpointing"].reason
    )


def test_the_component_passes_gpu_memory_to_the_resolver(monkeypatch, tmp_path):
    """run_component reads gpu_memory_gib as a step parameter (not a torchtune setting) and hands the placement's
    memory to run_finetune."""
    from kfp import dsl

    from kfp_finetune.components.torchtune_finetune import finetune

    seen = {}

    class Stop(Exception):
        pass

    def run_finetune(**kw):
        seen.update(kw)
        raise Stop

    monkeypatch.setattr(finetune, "run_finetune", run_finetune)
    monkeypatch.setattr(finetune, "backend_for", lambda *a, **kw: None)
    params = {
        "workspace_path": str(tmp_path), "train_data": None, "base_model": None, "eval_data": None, "run_id": "r",
        "task_name": "t", "backend": "local", "num_nodes": 1, "num_proc_per_node": 0, "runtime_name": "x",
        "runtime_kind": "x", "trainer_image": "", "timeout_seconds": 0, "cleanup_policy": "on-success",
        "workspace_pvc": "", "method": "lora",
    }  # fmt: skip
    h200 = dsl.TaskConfig(node_selector={"nvidia.com/gpu.product": "NVIDIA-H200"})
    for task, (given, expected) in enumerate(((-1.0, 141.0), (96.0, 96.0))):
        with pytest.raises(Stop):  # each its own task: a second attempt of one would be refused (attempts.py)
            finetune.run_component(**params, kubernetes_config=h200, gpu_memory_gib=given, task_id=str(task))
        assert seen["gpu_memory_gib"] == expected and "gpu_memory_gib" not in seen["settings"]


def test_recorded_lengths_give_the_length_dataset_initialize_packed_to():
    """The fine-tune step reads dataset-initialize's stats of every row: the max_seq_len default is the pack length."""
    from kfp_finetune.components._shared.contract import DatasetSplit
    from kfp_finetune.components._shared.seq_len_rule import choose_max_seq_len
    from kfp_finetune.components.torchtune_finetune.finetune import recorded_lengths

    lengths = recorded_lengths(DatasetSplit(token_stats={"count": 1000, "p50": 120, "p99": 700, "max": 3000}))
    assert choose_max_seq_len(lengths.lengths, 8192) == 768 and lengths.num_rows == 1000
    assert "all 1000 rows" in lengths.how and lengths.longest_prompt == 0
    stats = {"count": 1000, "p50": 120, "p99": 700, "max": 3000, "prompt_max": 2000}
    lengths = recorded_lengths(DatasetSplit(token_stats=stats))
    assert lengths.longest_prompt == 2000
    assert choose_max_seq_len(lengths.lengths, 8192) == 768  # one long prompt does not set it (seq_len.py)
    assert recorded_lengths(DatasetSplit()) is None


def test_the_max_seq_len_default_is_not_set_by_the_longest_prompt(tiny_llama, tmp_path):
    """One row in a hundred has a prompt longer than the 99th percentile's length: the default stays the
    percentile's (the outlier does not set every pack's length), the reason says the row trains nothing, and
    prompt_fit counts it without refusing our own default."""
    from kfp_finetune.components._shared.torchtune.defaults import sample_token_lengths
    from kfp_finetune.components._shared.torchtune.prompt_fit import check_prompts_fit
    from tests.support.long_prompt import LONG_ROW, ROWS, write_jsonl

    data = write_jsonl(tmp_path / "long-prompt.jsonl")
    # One epoch set: 100 rows in a few long packs plan fewer than MIN_OPTIMIZER_STEPS, kept (with a warning).
    run = resolve_run(
        TorchtuneConfig(method="lora", device="cuda", epochs=1),
        tiny_llama,
        data,
        tmp_path / "run",
        write=False,
    )
    lengths = run.token_lengths
    assert "all 100 rows" in lengths.how and lengths.num_rows == ROWS
    p99 = math.ceil(sorted(lengths.lengths)[98] / 256) * 256
    assert run.config["tokenizer"]["max_seq_len"] == p99 == 256 < lengths.longest_prompt
    assert f"the longest: {lengths.longest_prompt} tokens) train nothing" in chosen(run)["max_seq_len"].reason
    check_prompts_fit({**run.config, "batch_size": 2})  # our own default is never refused
    # A small sample that misses the long row still finds its prompt among prompt_fit's longest candidates.
    few = sample_token_lengths(run.config, rows=5, seed=0)
    assert len(few.lengths) == 5 and max(few.lengths) < 256
    assert few.longest_prompt == lengths.longest_prompt
    assert LONG_ROW not in sorted(__import__("random").Random(0).sample(range(ROWS), 5))


def test_several_nodes_take_a_32k_micro_batch_only_where_it_fits_without_checkpointing(tmp_path, data):
    """Every micro-batch's gradient reduce-scatter crosses the nodes: on 2 nodes x 8 GPUs a 32k-token micro-batch
    (half the accumulation steps) where the memory model fits it without activation checkpointing; never by turning
    checkpointing on, and never on one node (the same 16 GPUs)."""
    import copy

    from kfp_finetune.components._shared.torchtune.defaults import choose_defaults

    rows = TokenLengths([1000] * 100, num_rows=100_000, how="the test")  # max_seq_len 1024
    big_base = {"batch_size": 32, "gradient_accumulation_steps": 32}  # ~1M tokens per optimizer step

    models = {family: fake_model_dir(tmp_path, family) for family in ("llama3_2", "llama3_1")}

    def plan(family, gib, devices, nodes, **settings):
        run = on_gpu(
            models[family], tmp_path, lengths=rows, method="full",
            gpu_memory_gib=gib, devices=devices, nodes=nodes, **settings,
        )  # fmt: skip
        config = copy.deepcopy(run.config)  # again, from a base config with a larger global batch
        cfg = TorchtuneConfig(method="full", device="cuda", **settings)
        choices, _ = choose_defaults(config, big_base, cfg, run.model, devices, nodes, gib, rows)
        tokens = config["batch_size"] * config["tokenizer"]["max_seq_len"]
        ckpt, accumulation = config["enable_activation_checkpointing"], config["gradient_accumulation_steps"]
        return tokens, ckpt, accumulation, {c.setting: c for c in choices}

    # Llama-3.2-1B dims, full fine-tune on 141 GiB GPUs: 32k tokens fit without checkpointing.
    one_node = plan("llama3_2", 141, 16, 1)
    two_nodes = plan("llama3_2", 141, 8, 2)
    assert one_node[:3] == (16384, False, 4)  # one node never gets 32k
    assert two_nodes[:3] == (32768, False, 2)  # half the accumulation steps
    assert "multi-node: fits without activation checkpointing, so fewer accumulation steps" in (
        two_nodes[3]["batch_size"].reason
    )
    # Llama-3.1-8B dims, full fine-tune on 80 GiB: 32k would need checkpointing, so the one-node choice stays.
    one_node, two_nodes = plan("llama3_1", 80, 16, 1), plan("llama3_1", 80, 8, 2)
    assert two_nodes[:3] == one_node[:3] and two_nodes[0] <= 16384 and two_nodes[1] is False
    assert "32768 on 2 nodes would need activation checkpointing" in two_nodes[3]["batch_size"].reason
    # Checkpointing the user turned on does not make room for 32k either: the bigger micro-batch is never checkpointed.
    forced = plan("llama3_2", 141, 8, 2, enable_activation_checkpointing=True)
    assert forced[:2] == (16384, True)


def test_several_nodes_keep_gathered_weights_where_the_whole_model_fits(tmp_path, data):
    """Fewer all-gathers over the nodes' network (FSDP2 reshard_after_forward=False) where the memory model fits
    the unsharded weights; resharded where it does not; never decided for one node, never over the user's say."""
    from kfp_finetune.components._shared.torchtune.defaults import RESHARD_KEY

    models = {family: fake_model_dir(tmp_path, family) for family in ("llama3_2", "llama3_1")}

    def plan(family, gib, devices, nodes, **settings):
        run = on_gpu(models[family], tmp_path, lengths=LENGTHS, method="full",
                     gpu_memory_gib=gib, devices=devices, nodes=nodes, **settings)  # fmt: skip
        return run.config.get(RESHARD_KEY), {c.setting: c.reason for c in run.defaults}.get(RESHARD_KEY, "")

    kept, why = plan("llama3_2", 80, 8, 2)  # 1B: 2.5 GB of bf16 weights beside the rest
    assert kept is False and "a third less traffic between the nodes" in why
    assert plan("llama3_2", 80, 16, 1) == (None, "")  # one node: torchtune's default (resharded)
    resharded, why = plan(
        "llama3_1", 24, 8, 2
    )  # 8B: 16 GB of weights cannot stay gathered beside the rest on 24 GB
    assert resharded is True and "would need" in why
    assert (
        plan("llama3_2", 80, 8, 2, overrides={f"+{RESHARD_KEY}": True})[0] is True
    )  # the user's choice stands


def test_a_pipeline_user_who_sets_nothing_gets_packing_and_compile_on_cuda(tmp_path, data):
    """The fine-tune component's own defaults (what every pipeline passes unless the user sets them) must leave
    packing and compile to the CUDA defaults: a plain `False` default would count as the user's choice."""
    import inspect

    from kfp_finetune.components._shared.torchtune.config import from_flat
    from kfp_finetune.components.torchtune_finetune import component
    from kfp_finetune.components.torchtune_finetune.finetune import component_settings

    signature = inspect.signature(component.torchtune_finetune.python_func)
    defaults = {name: p.default for name, p in signature.parameters.items() if p.default is not p.empty}
    settings = {k: v for k, v in component_settings(defaults).items() if v is not None}
    cfg = from_flat({**settings, "device": "cuda"})
    run = resolve_run(
        cfg, fake_model_dir(tmp_path, "llama3_2"), tmp_path / "data.jsonl", tmp_path / "run", validate=False,
        token_lengths=LENGTHS,
    )  # fmt: skip
    assert run.config["dataset"]["packed"] is True and run.config["compile"] is True
    assert {"packed", "compile"} <= set(chosen(run))


def test_no_activation_checkpointing_cliff_at_lengths_between_the_busy_micro_batches(tmp_path, data):
    """Issue 27: Llama-3.1-8B LoRA on one 80 GB GPU turned checkpointing on at max_seq_len 2304 and 3072, where the
    busy micro-batch rounds up past what fits (9 216 / 15 360 tokens): a smaller whole-sequence micro-batch without
    checkpointing is tried first (6 912 / 6 144 tokens), as at every length around them."""
    model = fake_model_dir(tmp_path, "llama3_1")
    for n in (1024, 2048, 2304, 2560, 3072, 4096, 8192):
        run = on_gpu(model, tmp_path, lengths=TokenLengths([n // 2] * 100, 100_000, "the test"), method="lora",
                     max_seq_len=n, gpu_memory_gib=80)  # fmt: skip
        tokens = run.config["batch_size"] * n
        assert run.config["enable_activation_checkpointing"] is False, (n, tokens)
        assert tokens >= 4096, (n, tokens)
    # On a 48 GB GPU some lengths take a micro-batch under 8k to stay unchecked, and say why.
    smaller = []
    for n in (2304, 2560, 3072, 3328):
        run = on_gpu(model, tmp_path, lengths=TokenLengths([n // 2] * 100, 100_000, "the test"), method="lora",
                     max_seq_len=n, gpu_memory_gib=48)  # fmt: skip
        reasons = {c.setting: c.reason for c in run.defaults}
        if run.config["batch_size"] * n < 8192 and not run.config["enable_activation_checkpointing"]:
            smaller.append(n)
            assert "the largest that fits without activation checkpointing" in reasons["batch_size"]
    assert smaller, "no length took a smaller micro-batch: the case this test checks did not occur"


@pytest.mark.parametrize(("family", "method", "gib"), [("llama3_1", "lora", 80), ("llama3_1", "full", 80),
                                                        ("llama3_2", "full", 24), ("qwen2_5", "lora", 24)])  # fmt: skip
def test_no_length_turns_checkpointing_on_while_a_smaller_micro_batch_fits_without(
    tmp_path, data, family, method, gib
):
    """Issue 27's sweep: at every max_seq_len from 512 to 8192 (steps of 256), checkpointing is on only when no
    whole-sequence micro-batch down to the floor fits without it, by the same memory model."""
    from kfp_finetune.components._shared.torchtune.defaults import (
        MEMORY_MARGIN,
        busy_floor_tokens,
        loss_chunks,
    )

    model_dir = fake_model_dir(tmp_path, family)
    world = 1 if method == "lora" else 8
    for n in range(512, 8192 + 1, 256):
        run = on_gpu(model_dir, tmp_path, lengths=TokenLengths([n // 2] * 100, 100_000, "the test"), method=method,
                     max_seq_len=n, gpu_memory_gib=gib, devices=world)  # fmt: skip
        c = run.config
        if not c["enable_activation_checkpointing"]:
            continue
        lora = c["model"] if method != "full" else None
        for k in range(1, 16384 // n + 1):
            if k * n < busy_floor_tokens(run.model):
                continue
            estimate = estimate_memory(run.model, method, lora, c["dtype"], c["optimizer"]["_component_"], world,
                                       k * n, loss_chunks(c))  # fmt: skip
            assert estimate.total(False) > gib * MEMORY_MARGIN, (
                f"max_seq_len {n}: {k * n} tokens fit unchecked"
            )
