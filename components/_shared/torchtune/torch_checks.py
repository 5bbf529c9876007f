"""The checks of a resolved config that need torch, run where training runs: in-process by the local backend,
first thing in every TrainJob node pod (entrypoint.py) — never in the launcher step, which has no torch.

- torchtune's own validation (what `tune validate` runs): every component importable, its arguments bindable;
- no training row's prompt fills max_seq_len (prompt_fit.py: the rows are tokenized as training will).

resolve.py has already checked all that needs no torch (keys, paths, numbers, dims).
"""

from __future__ import annotations

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.torchtune import builder_nodes, flex_attention, sample_packing
from kfp_finetune.components._shared.torchtune.prompt_fit import check_prompts_fit


def check_resolved(config: dict) -> None:
    """Raise ConfigError (or its PromptTooLong) naming the problem and the fix."""
    validate_config(config)
    check_prompts_fit(config)


def validate_config(config: dict) -> None:
    """torchtune's own check (what `tune validate` runs): every component importable, arguments bindable; for
    the nodes our builders wrap or stand in for (sample_packing.py, flex_attention.py, the packs' builder_nodes
    record, which evaluation builds its split with), the torchtune builder's arguments too."""
    from omegaconf import OmegaConf
    from torchtune.config import validate
    from torchtune.config._errors import ConfigError as TorchtuneConfigError
    from torchtune.config._errors import InstantiationError

    unwrapped = {
        **config,
        "dataset": sample_packing.unwrap(builder_nodes.torchtune_node(config["dataset"])),
        "model": flex_attention.unwrap(config["model"]),
    }
    try:
        validate(OmegaConf.create(config))
        validate(OmegaConf.create(unwrapped))
    except (TorchtuneConfigError, TypeError) as err:
        raise ConfigError(f"torchtune rejects the resolved config: {err}") from err
    except (InstantiationError, ImportError, AttributeError, ValueError) as err:
        summary = " ".join(str(err).splitlines()[:2])
        raise ConfigError(
            f"torchtune cannot load a component named in the config ({summary}); install the package "
            "that provides it, or choose another component (e.g. tune_optimizer=torch.optim.AdamW)"
        ) from err
