"""The checks of a resolved config that need torch, run first thing in the process that trains (entrypoint.py):
a TrainJob's node pods, the local backend's child — never in the launcher step, which has no torch.

- torchtune's own validation (what `tune validate` runs): every component importable, its arguments bindable;
- no training row's prompt fills max_seq_len (prompt_fit.py: the rows are tokenized as training will).

And, in the node pods only (seconds, no weights read), `check_layout_parity`: the model's layout computes what
transformers computes, measured on a tiny random copy (parity.py) in the directions the run's weights travel.

resolve.py has already checked all that needs no torch (keys, paths, numbers, dims).
"""

from __future__ import annotations

import json
from pathlib import Path

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.torchtune import builder_nodes, flex_attention, parity, sample_packing
from kfp_finetune.components._shared.torchtune.model_inspection import detect_family
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


def check_layout_parity(config: dict) -> str:
    """Measure the parity of the run's model layout (its config.json: the exact architecture) in the directions
    its method writes; a line saying what was measured, or why nothing was (transformers not installed).

    Raises ConfigError naming each direction beyond parity.TOLERANCE."""
    model = config["model"]
    # QLoRA measures as LoRA (parity.METHOD_DIRECTIONS).
    method = "full" if "lora_rank" not in model else ("dora" if model.get("use_dora") else "lora")
    directions = parity.METHOD_DIRECTIONS[method]
    missing = parity.missing_libraries([parity.LOAD])
    if missing:
        return f"layout parity with transformers not measured ({', '.join(missing)} not installed)"
    model_dir = Path(config["checkpointer"]["checkpoint_dir"])
    hf_config = json.loads((model_dir / "config.json").read_text())
    measured = parity.measure(hf_config, detect_family(model_dir, hf_config), directions)
    if not measured.passed:
        failed = "; ".join(m.line() for m in measured.failed())
        raise ConfigError(
            f"the {measured.family} layout of {model_dir / 'config.json'} does not compute what transformers "
            f"computes ({failed}): torchtune 0.6.1 would train another model than the one loaded and exported; "
            "choose a model of a layout docs/families.md lists as proven, or report this layout"
        )
    shown = ", ".join(
        f"{m.direction} {m.difference:.0e}" if m.difference is not None else f"{m.direction} not measured"
        for m in measured.measurements
    )
    return f"layout parity with transformers ({method}): {shown} (tolerance {parity.TOLERANCE:.0e})"
