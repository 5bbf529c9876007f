"""Every `_component_` path of a resolved torchtune config, checked against the installed files without importing
torch (the launcher and pre-flight steps run on the component image, which has none):

- torchtune.* and kfp_finetune.*: the module's source defines or re-exports the name
  (installed.module_names);
- torch.optim.* and torch.optim.lr_scheduler.*: a public optimizer or scheduler (the table in torch_names.py);
- anything else (bitsandbytes.optim.PagedAdamW8bit, another torch module): not checked here; torchtune's own
  validation imports it where training runs (torch_checks.validate_config).

A misspelt path is named with the nearest existing one.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from dataclasses import dataclass

from kfp_finetune.components._shared.errors import ConfigError, SettingError
from kfp_finetune.components._shared.torchtune import installed, torch_names
from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig

CHECKED_PACKAGES = ("torchtune", "kfp_finetune")


@dataclass(frozen=True)
class UnknownComponent:
    key: str  # where it is in the config, e.g. "optimizer" (the node whose `_component_` it is)
    path: str  # the dotted path, e.g. "torch.optim.AdamWW"
    why: str  # what was looked at, with the nearest existing path when there is one

    def __str__(self) -> str:
        return f"{self.key}._component_ {self.path!r} {self.why}"


def components(config: dict, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(node key, dotted path) for every `_component_` in `config`, nested nodes and lists included."""
    for key, value in config.items():
        where = f"{prefix}{key}"
        if key == "_component_" and isinstance(value, str):
            yield prefix.rstrip(".") or "<root>", value
        elif isinstance(value, dict):
            yield from components(value, f"{where}.")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    yield from components(item, f"{where}[{i}].")


def unknown_components(config: dict) -> list[UnknownComponent]:
    """The `_component_` paths that name nothing in the installed torchtune / kfp_finetune, or in torch's table."""
    found = []
    for key, path in components(config):
        why = _not_found(path)
        if why:
            found.append(UnknownComponent(key, path, why))
    return found


def _not_found(path: str) -> str | None:
    module, _, name = path.rpartition(".")
    if module in torch_names.MODULES:
        names = torch_names.MODULES[module]
        if name in names:
            return None
        return f"is not a public class of {module}{_nearest(module, name, names)}"
    if path.split(".", 1)[0] not in CHECKED_PACKAGES:
        return None
    names = installed.module_names(module)
    if name in names:
        return None
    package = "torchtune 0.6.1" if path.startswith("torchtune.") else "kfp-finetune"
    return f"is not defined in the installed {package}{_nearest(module, name, names)}"


def _nearest(module: str, name: str, names) -> str:
    close = difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.6)
    return f": did you mean {module}.{close[0]}?" if close else ""


def check_components(config: dict, cfg: TorchtuneConfig, base_name: str) -> None:
    """Every `_component_` path names something that exists (see the module's docstring), or a ConfigError
    blames the first that does not on the setting that put it there."""
    unknown = unknown_components(config)
    if not unknown:
        return
    first = unknown[0]
    typed = {"optimizer": cfg.optimizer, "lr_scheduler": cfg.lr_scheduler, "loss": cfg.loss}
    if typed.get(first.key) == first.path:
        raise SettingError(first.key, f"{first.path!r} {first.why}")
    for key, value in cfg.overrides.items():  # a path, or a node holding one (`{"optimizer": {...}}`)
        named = [path for _, path in components(value)] if isinstance(value, dict) else [value]
        if first.path in named:
            raise SettingError("overrides", f"[{key!r}] {first.path!r} {first.why}")
    raise ConfigError(f"{first} (from the base config {base_name}): override it with a component that exists")
