"""`_component_` paths are checked without torch: torchtune's and our own from their source files, torch's
optimizers and schedulers from a table that is checked here against the installed torch."""

import inspect

import pytest
import yaml

from kfp_finetune.components._shared.errors import SettingError
from kfp_finetune.components._shared.torchtune import installed, torch_names
from kfp_finetune.components._shared.torchtune.component_paths import unknown_components
from kfp_finetune.components._shared.torchtune.config import from_flat
from kfp_finetune.components._shared.torchtune.resolve import resolve_run


def test_the_torch_table_is_the_installed_torchs_optimizers_and_schedulers():
    import torch.optim
    import torch.optim.lr_scheduler as schedulers

    optimizers = {
        name for name, value in vars(torch.optim).items()
        if inspect.isclass(value) and issubclass(value, torch.optim.Optimizer) and value is not torch.optim.Optimizer
    }  # fmt: skip
    defined = {
        name for name, value in vars(schedulers).items()
        if inspect.isclass(value) and value.__module__ == schedulers.__name__ and not name.startswith("_")
        and name != "LRScheduler"
    }  # fmt: skip
    assert optimizers == torch_names.OPTIMIZERS
    assert defined == torch_names.LR_SCHEDULERS


@pytest.mark.slow
def test_every_component_of_every_torchtune_config_is_known():
    """No false alarm: each `_component_` of torchtune 0.6.1's own configs passes (bitsandbytes is not ours to
    check without importing it)."""
    configs = sorted((installed.package_dir().parent / "recipes" / "configs").rglob("*.yaml"))
    assert len(configs) > 100
    refused = {str(u) for path in configs for u in unknown_components(yaml.safe_load(path.read_text()) or {})}
    assert refused == set()


@pytest.mark.parametrize(
    ("path", "nearest"),
    [
        ("torch.optim.AdamWW", "torch.optim.AdamW"),
        ("torch.optim.lr_scheduler.CosineAnealingLR", "torch.optim.lr_scheduler.CosineAnnealingLR"),
        ("torchtune.modules.loss.CEWithChunkedOutputLos", "torchtune.modules.loss.CEWithChunkedOutputLoss"),
        ("torchtune.training.lr_schedulers.get_cosine_schedul_with_warmup",
         "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup"),
    ],
)  # fmt: skip
def test_a_misspelt_path_is_refused_with_the_nearest_one(path, nearest):
    (unknown,) = unknown_components(
        {"node": {"_component_": path, "inner": [{"_component_": "torch.optim.SGD"}]}}
    )
    assert unknown.key == "node" and unknown.path == path
    assert f"did you mean {nearest}?" in unknown.why


def test_resolve_blames_the_setting_that_named_the_component(tiny_llama, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text(
        '{"input": "q", "output": "a"}\n' * 40
    )  # enough rows for a run that learns (run_length.py)

    def refused(**settings) -> SettingError:
        with pytest.raises(SettingError) as failed:
            resolve_run(
                from_flat({"device": "cpu", **settings}), tiny_llama, data, tmp_path / "run", write=False
            )
        return failed.value

    assert refused(optimizer="torch.optim.Adamw").setting == "optimizer"
    assert refused(lr_scheduler="torch.optim.lr_scheduler.StepLr").setting == "lr_scheduler"
    assert refused(loss="torchtune.modules.loss.CrossEntropy").setting == "loss"
    error = refused(overrides={"optimizer._component_": "torch.optim.Sgd"})
    assert error.setting == "overrides" and "['optimizer._component_']" in error.problem
    error = refused(overrides={"+x": [1, 2], "optimizer": {"_component_": "torch.optim.Sgd", "lr": 0.1}})
    assert error.setting == "overrides" and "['optimizer']" in error.problem
