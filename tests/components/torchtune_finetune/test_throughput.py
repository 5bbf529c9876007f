"""Processed tokens/s and MFU from a synthetic metrics log and device.json (no GPU): the numbers are worked out
here by hand from Llama-3.1-8B's published dims, not by calling the code under test."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from kfp_finetune.components._shared.metrics_file import read_metrics_file
from kfp_finetune.components.torchtune_finetune import metrics as metrics_module
from kfp_finetune.components.torchtune_finetune.entrypoint import note_device
from kfp_finetune.components.torchtune_finetune.metrics import TeeMetricLogger
from kfp_finetune.components.torchtune_finetune.report import torchtune_report
from kfp_finetune.components.torchtune_finetune.throughput import (
    measure,
    peak_tflops,
    read_device,
)

LLAMA_8B = {  # meta-llama/Llama-3.1-8B config.json
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
}
# layers x (attention 4096*128*(2*32 + 2*8) + mlp 3*4096*14336) + embeddings 2 x 128256*4096
N_8B = 32 * (41_943_040 + 176_160_768) + 1_050_673_152
N_MATMUL = N_8B - 128256 * 4096  # the input embedding is a lookup
# rank 8 on q_proj (4096->4096) and v_proj (4096->1024)
LORA_QV = 32 * (8 * (4096 + 4096) + 8 * (4096 + 1024))
ATTENTION = 12 * 32 * 4096 * 2048


def _config(packed: bool = True, lora: bool = True, dtype: str = "bf16") -> dict:
    model = {"lora_rank": 8, "lora_alpha": 16, "lora_attn_modules": ["q_proj", "v_proj"]} if lora else {}
    return {
        "model": model,
        "tokenizer": {"max_seq_len": 2048},
        "dataset": {"packed": packed},
        "batch_size": 2,
        "gradient_accumulation_steps": 4,
        "dtype": dtype,
    }


def _log(tmp_path, device: dict | None):
    """A metrics log as our logger writes it on a GPU: the first line without a step time (compile, warm-up), then
    2 s per step, one 30 s interval with a checkpoint (the median ignores it)."""
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "metrics.txt").write_text(
        "Step 1 | loss:2.1 lr:0.0001 tokens_per_second_per_gpu:900.0 peak_memory_alloc:20.5 \n"
        "Step 2 | loss:2.0 lr:0.0001 tokens_per_second_per_gpu:3000.0 seconds_per_step:2.0 \n"
        "Step 3 | loss:1.9 lr:0.0001 tokens_per_second_per_gpu:3000.0 seconds_per_step:30.0 \n"
        "Step 4 | loss:1.8 lr:0.0001 tokens_per_second_per_gpu:3000.0 seconds_per_step:2.0 \n"
    )
    if device is not None:
        (run / "device.json").write_text(json.dumps(device))
    return read_metrics_file(run / "logs" / "metrics.txt"), read_device(run)


H100 = {"name": "NVIDIA H100 80GB HBM3", "count": 8, "cuda": True}


def test_packed_lora_run_on_an_h100_reports_processed_tokens_and_mfu(tmp_path):
    steps, device = _log(tmp_path, H100)
    speed = measure(_config(), LLAMA_8B, N_8B, steps, device, world_size=8)
    processed = 2 * 2048 * 4 / 2.0  # batch x max_seq_len x accumulation per step / median step time
    assert speed.processed_tokens_per_second == pytest.approx(processed)
    assert speed.trained_tokens_per_second == pytest.approx((900 + 3 * 3000) / 4)
    flops = 4 * N_MATMUL + 6 * LORA_QV + ATTENTION  # LoRA: forward 2N + input gradients 2N + adapters 6N_t
    assert speed.flops_per_token == pytest.approx(flops)
    assert speed.mfu == pytest.approx(processed * flops / 989e12)
    assert 0.2 < speed.mfu < 0.35  # a plausible LoRA MFU: the units are right
    assert speed.metrics() == {
        "processed_tokens_per_second": pytest.approx(processed),
        "mfu": pytest.approx(speed.mfu),
        "peak_tflops": 989.0,
    }
    line = speed.log_line()
    assert "8,192.0" in line and "65,536.0 on 8 GPU(s)" in line and "H100 SXM" in line and "MFU 27." in line


def test_attention_is_charged_over_each_rows_tokens_when_the_lengths_are_known(tmp_path):
    steps, device = _log(tmp_path, H100)
    # Rows of 300, 1000 and 3000 tokens packed at 2048: the last is cut to 2048; a token attends within its row.
    lengths = [300, 1000, 3000]
    context = (300**2 + 1000**2 + 2048**2) / (300 + 1000 + 2048)  # 1 578.3 tokens, not the pack's 2048
    speed = measure(_config(), LLAMA_8B, N_8B, steps, device, world_size=8, token_lengths=lengths)
    whole_pack = measure(_config(), LLAMA_8B, N_8B, steps, device, world_size=8)
    flops = 4 * N_MATMUL + 6 * LORA_QV + 12 * 32 * 4096 * round(context)
    assert speed.flops_per_token == pytest.approx(flops)
    assert speed.mfu == pytest.approx(whole_pack.mfu * flops / whole_pack.flops_per_token)
    assert speed.mfu < whole_pack.mfu
    assert "mean context 1,578 of max_seq_len 2048" in speed.mfu_note
    assert "upper bound" in whole_pack.mfu_note


def test_full_fine_tune_counts_6n_per_token(tmp_path):
    steps, device = _log(tmp_path, H100)
    speed = measure(_config(lora=False), LLAMA_8B, N_8B, steps, device)
    assert speed.flops_per_token == pytest.approx(6 * N_MATMUL + ATTENTION)


def test_unpacked_data_falls_back_to_torchtunes_rate_as_a_lower_bound(tmp_path):
    steps, device = _log(tmp_path, H100)
    speed = measure(_config(packed=False), LLAMA_8B, N_8B, steps, device)
    assert speed.processed_tokens_per_second == speed.trained_tokens_per_second
    assert "lower bound" in speed.processed_note


@pytest.mark.parametrize(
    ("device", "dtype", "why"),
    [
        ({"name": "NVIDIA Quadro P1000", "cuda": True}, "bf16", "not in the table"),
        ({"name": "cpu", "cuda": False}, "fp32", "trained on CPU"),
        (None, "bf16", "no device.json"),
        (H100, "fp32", "dtype fp32"),
    ],
)
def test_mfu_is_not_reported_without_a_known_gpu_and_says_why(tmp_path, device, dtype, why):
    steps, recorded = _log(tmp_path, device)
    speed = measure(_config(dtype=dtype), LLAMA_8B, N_8B, steps, recorded)
    assert speed.mfu is None and "mfu" not in speed.metrics()
    assert why in speed.mfu_note and why in speed.log_line()
    assert speed.processed_tokens_per_second == pytest.approx(8192.0)  # still reported


@pytest.mark.parametrize(
    ("name", "product", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.0),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756.0),
        ("NVIDIA H200", "H200 SXM", 989.0),
        ("NVIDIA GH200 480GB", "GH200", 989.0),
        ("NVIDIA A100-SXM4-80GB", "A100", 312.0),
        ("NVIDIA L40S", "L40S", 362.0),
        ("NVIDIA L4", "L4", 121.0),
        ("NVIDIA A10G", "A10G", 125.0),
    ],
)
def test_peak_table_matches_cuda_device_names(name, product, tflops):
    assert peak_tflops(name) == (product, tflops)


def test_metric_logger_adds_the_step_time(tmp_path, monkeypatch):
    clock = iter([100.0, 101.5, 107.5])
    monkeypatch.setattr(metrics_module.time, "monotonic", lambda: next(clock))
    logger = TeeMetricLogger(str(tmp_path))
    for step in (1, 2, 4):  # log_every_n_steps=2 after step 2: 6 s over 2 steps
        logger.log_dict({"loss": 1.0, "tokens_per_second_per_gpu": 10.0}, step=step)
    logger.close()
    steps = read_metrics_file(tmp_path / "metrics.txt")
    assert [s.values.get("seconds_per_step") for s in steps] == [None, 1.5, 3.0]


def test_trainer_records_its_device_in_the_run_folder(tmp_path):
    note_device(tmp_path)  # CPU here: recorded as such, so the launcher says why there is no MFU
    assert read_device(tmp_path) == {"name": "cpu", "count": 1, "cuda": False}


def test_report_shows_the_throughput_rows(tmp_path):
    steps, device = _log(tmp_path, H100)
    speed = measure(_config(), LLAMA_8B, N_8B, steps, device)
    config = {
        **_config(),
        "optimizer": {"_component_": "torch.optim.AdamW", "lr": 1e-4},
        "dataset": {"packed": True, "data_files": ["x.jsonl"]},
    }
    run = SimpleNamespace(recipe="lora_finetune_single_device", config_name="x", config=config, defaults=[])
    meta = {"method": "lora", "base_model": "m", "dataset_source": "d"}
    html = torchtune_report(run, steps, {"mfu": speed.mfu}, meta, speed)
    assert "Throughput" in html and "processed tokens/s per GPU" in html and "MFU" in html
