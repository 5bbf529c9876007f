"""The node entrypoint measures the model layout's parity with transformers before `tune run`: a layout that
differs is refused with one line (CONFIG_REFUSED), a matching one is named with its measured differences, and
without transformers the check is skipped with one line. `os.execv` is replaced: these tests never train."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest

from kfp_finetune.components._shared.torchtune import conversions
from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig
from kfp_finetune.components._shared.torchtune.resolve import resolve_run, tune_command
from kfp_finetune.components.torchtune_finetune import entrypoint


@pytest.fixture
def node_argv(tiny_llama, tiny_dataset, tmp_path):
    run = resolve_run(
        TorchtuneConfig(method="lora", device="cpu"),
        tiny_llama,
        tiny_dataset["train.jsonl"],
        tmp_path / "run",
    )
    return tune_command(run.recipe, run.yaml_path)


@pytest.fixture
def execs(monkeypatch):
    """The commands the entrypoint would have become."""
    became: list[list[str]] = []
    monkeypatch.setattr(entrypoint.os, "execv", lambda path, argv: became.append(argv))
    return became


@pytest.mark.slow
def test_a_layout_that_computes_another_model_is_refused_with_one_line(node_argv, execs, monkeypatch, capsys):
    # Llama's q/k rows loaded without their RoPE reordering (Qwen2's conversion): another model than transformers'.
    llama = conversions.CONVERSIONS["LLAMA3_2"]
    unpermuted = dataclasses.replace(llama, hf_to_tune=conversions.CONVERSIONS["QWEN2"].hf_to_tune)
    monkeypatch.setitem(conversions.CONVERSIONS, "LLAMA3_2", unpermuted)
    assert entrypoint.main(node_argv) == entrypoint.CONFIG_REFUSED
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith(entrypoint.PREFIX)]
    assert len(said) == 1, said
    assert "does not compute what transformers computes (load: max |Δlogit|" in said[0], said
    assert execs == []


@pytest.mark.slow
def test_a_proven_layout_is_measured_then_trained(node_argv, execs, capsys):
    entrypoint.main(node_argv)
    out = capsys.readouterr().out
    assert "layout parity with transformers (lora): load " in out and "lora merged " in out, out
    assert [argv[1:] for argv in execs] == [node_argv[1:]]


@pytest.mark.slow
def test_without_transformers_the_check_says_so_and_training_goes_on(node_argv, execs, monkeypatch, capsys):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "transformers" else find_spec(name, *args),
    )
    entrypoint.main(node_argv)
    out = capsys.readouterr().out
    assert "layout parity with transformers not measured (transformers not installed)" in out, out
    assert len(execs) == 1
