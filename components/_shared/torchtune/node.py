"""What a TrainJob node pod runs for the torchtune engine (the fine-tune step's entrypoint.py calls these through
the face): `tune run [torchrun flags] <recipe> --config <yaml>`.

- `check_node_command(argv)`: torchtune's config validation, the prompts against max_seq_len and the model
  layout's logit parity with transformers on a tiny random copy (torch_checks.py) — the checks the launcher,
  which has no torch, leaves to the pod. Returns the run folder and what was checked; ConfigError when the
  config must not train. The local backend's child (`local=True`) makes the same checks but the parity.
- `run_node_command(argv)`: torchtune's own `tune` CLI in this process (one device: the recipe runs here and
  receives the pod's SIGTERM; several: torchrun's agent runs here).
"""

from __future__ import annotations

from pathlib import Path

import yaml

USAGE = "tune run [torchrun flags] <recipe> --config <yaml>"


def config_path(argv: list[str]) -> Path:
    try:
        return Path(argv[argv.index("--config") + 1])
    except (ValueError, IndexError):
        raise SystemExit(f"usage: {USAGE}") from None


def check_node_command(argv: list[str], *, local: bool = False) -> tuple[Path, list[str]]:
    """(run folder, lines saying what was checked) for `tune run ... --config <yaml>`; ConfigError naming the
    problem when the resolved config cannot train. Imports torch and torchtune; the layout parity (not measured
    for a local run) imports transformers."""
    from kfp_finetune.components._shared.errors import ConfigError
    from kfp_finetune.components._shared.torchtune.torch_checks import check_layout_parity, check_resolved

    if argv[:1] != ["tune"]:
        raise SystemExit(f"usage: {USAGE}")
    path = config_path(argv)
    config = yaml.safe_load(path.read_text())
    try:
        check_resolved(config)
        parity = [] if local else [check_layout_parity(config)]
    except ConfigError as error:
        raise ConfigError(f"the resolved config {path}: {error}") from None
    return path.parent, [
        f"config {path.name} checked (torchtune validation, prompts fit max_seq_len)",
        *parity,
    ]


def run_node_command(argv: list[str]) -> int:
    from kfp_finetune.components._shared.torchtune.tune_cli import run_tune

    return run_tune(argv)
