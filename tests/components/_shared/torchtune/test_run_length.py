"""How long a run trains (run_length.py): the floor of optimizer steps on GPUs, the learning rate that follows a
grown global batch, and the schedule with no step at lr 0 (lr_schedule.py). GPU plans through the resolver and
`kfp-finetune resolve-config --device cuda` (no GPU here)."""

import argparse
import json
import math

import pytest
import yaml

from kfp_finetune.commands import resolve_config
from kfp_finetune.components._shared.torchtune import lr_schedule
from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig
from kfp_finetune.components._shared.torchtune.resolve import resolve_run
from kfp_finetune.components._shared.torchtune.run_length import (
    LR_SCALE_CAP,
    MIN_OPTIMIZER_STEPS,
    global_batch_ratio,
    planned_steps,
)
from tests.components._shared.torchtune.test_resolve import fake_model_dir

# Llama-3.1-8B's base configs: LoRA lr 3e-4 (batch 2 x accumulation 8), full lr 2e-5 (batch 2 x accumulation 1).
BASE_LR = {"lora": 3e-4, "full": 2e-5}


@pytest.fixture(scope="module")
def short_rows(tmp_path_factory):
    """2,000 short alpaca rows (a few dozen tokens each) and a Llama-3.1-8B model folder (config only)."""
    root = tmp_path_factory.mktemp("short")
    rows = [{"instruction": f"Name the capital of country {i}.", "input": "", "output": f"Capital {i}."}
            for i in range(2000)]  # fmt: skip
    data = root / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return fake_model_dir(root, "llama3_1"), data


def preview(short_rows, tmp_path, method, devices, **settings):
    """What `resolve-config --device cuda` resolves (token lengths estimated from characters: no torch)."""
    model, data = short_rows
    cfg = TorchtuneConfig(method=method, device="cuda", **settings)
    return resolve_run(
        cfg, model, data, tmp_path / "run", devices=devices, write=False, tokenize_sample=False
    )


@pytest.mark.parametrize(("method", "devices"), [("lora", 1), ("lora", 8), ("full", 8)])
def test_gpu_defaults_plan_the_floor_on_2000_short_rows(short_rows, tmp_path, method, devices):
    """Before: 2 optimizer steps for full and LoRA on 8 GPUs (a throughput micro-batch holding all the data)."""
    run = preview(short_rows, tmp_path, method, devices)
    steps = planned_steps(run.config, run.world, run.token_lengths)
    assert steps >= MIN_OPTIMIZER_STEPS
    assert run.config["epochs"] <= 3
    choices = {c.setting: c for c in run.defaults}
    assert not any(c.warning for c in run.defaults)
    assert choices["optimizer steps"].value == steps
    assert all("lower the learning rate" not in c.reason for c in run.defaults)


def test_the_resolve_config_cli_prints_the_plan(short_rows, tmp_path, capsys):
    model, data = short_rows
    parser = argparse.ArgumentParser()
    resolve_config.add_arguments(parser)
    args = parser.parse_args(["--model-dir", str(model), "--data", str(data), "--device", "cuda", "--devices", "8",
                              "--run-dir", str(tmp_path / "run")])  # fmt: skip
    assert resolve_config.run(args) == 0
    out = capsys.readouterr().out
    printed = yaml.safe_load(out)
    line = next(x for x in out.splitlines() if x.startswith("# default optimizer steps = "))
    steps = int(line.split("= ")[1].split(":")[0])
    assert steps >= MIN_OPTIMIZER_STEPS
    assert steps == planned_steps(printed, 8, preview(short_rows, tmp_path, "lora", 8).token_lengths)


def test_the_learning_rate_follows_a_grown_global_batch(short_rows, tmp_path):
    grown = preview(short_rows, tmp_path, "lora", 8)
    # The base config (batch 2 x accumulation 8) was written for 2 devices: its header's --nproc_per_node 2.
    ratio = global_batch_ratio(grown.config, {"batch_size": 2, "gradient_accumulation_steps": 8}, 8,
                               grown.token_lengths, base_world=2)  # fmt: skip
    assert ratio > LR_SCALE_CAP**2  # the cap applies
    assert grown.config["optimizer"]["lr"] == pytest.approx(BASE_LR["lora"] * LR_SCALE_CAP)
    reason = next(c for c in grown.defaults if c.setting == "learning_rate").reason
    assert f"{ratio:.1f}x the base config's" in reason and "square-root rule" in reason
    # A rate the user set is kept; below the rule's, a warning says which way to change it.
    low = preview(short_rows, tmp_path, "lora", 8, learning_rate=1e-4)
    assert low.config["optimizer"]["lr"] == 1e-4
    warning = next(c for c in low.defaults if c.warning)
    assert warning.setting == "learning_rate" and "raise tune_learning_rate" in warning.reason
    high = preview(short_rows, tmp_path, "lora", 8, learning_rate=1e-3)
    assert high.config["optimizer"]["lr"] == 1e-3 and not any(c.warning for c in high.defaults)


def test_a_global_batch_near_the_base_keeps_the_base_learning_rate(short_rows, tmp_path):
    same = preview(short_rows, tmp_path, "lora", 1, batch_size=2, gradient_accumulation_steps=8, packed=False)
    assert same.config["optimizer"]["lr"] == BASE_LR["lora"]
    assert "learning_rate" not in {c.setting for c in same.defaults}


def test_user_settings_that_plan_a_short_run_are_kept_with_a_warning(short_rows, tmp_path):
    run = preview(short_rows, tmp_path, "lora", 8, batch_size=32, gradient_accumulation_steps=4)
    assert (run.config["batch_size"], run.config["gradient_accumulation_steps"]) == (32, 4)
    warning = next(c for c in run.defaults if c.warning)
    assert warning.setting == "optimizer steps" and warning.value < MIN_OPTIMIZER_STEPS
    assert "lower tune_batch_size, lower tune_gradient_accumulation_steps or add rows" in warning.reason


@pytest.mark.parametrize("warmup", [0, 1, 5, 100])
def test_the_schedule_trains_no_step_at_lr_0(warmup):
    from torchtune.training.lr_schedulers import get_cosine_schedule_with_warmup

    total = 120
    ours = [lr_schedule.lr_multiplier(step, warmup, total) for step in range(total)]
    assert min(ours) > 0
    assert ours[min(warmup, total - 1)] == 1.0 or warmup >= total  # the peak once warmup is over
    torchtunes = get_cosine_schedule_with_warmup(_optimizer(), warmup, total).lr_lambdas[0]
    assert [torchtunes(s) for s in range(warmup, total)] == ours[warmup:]  # the same cosine after warmup
    if warmup:
        assert torchtunes(0) == 0.0  # what it replaces: the first step at lr 0


def test_torchtune_instantiates_the_schedule_from_a_resolved_config():
    from omegaconf import OmegaConf
    from torchtune import config

    optimizer = _optimizer()
    node = OmegaConf.create({"_component_": lr_schedule.COMPONENT, "num_warmup_steps": 3})
    scheduler = config.instantiate(node, optimizer, num_training_steps=20, last_epoch=-1)
    lrs = []
    for _ in range(20):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[0] == pytest.approx(0.1 * 1 / 4) and min(lrs) > 0
    assert lrs[3] == pytest.approx(0.1) and lrs[-1] < lrs[3]
    assert all(math.isfinite(lr) for lr in lrs)


def _optimizer():
    import torch

    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
