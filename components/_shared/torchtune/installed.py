"""What the launcher needs from torchtune, read from its installed files without importing it.

`import torchtune` (any submodule) imports torch, CUDA kernels and torchao: seconds and gigabytes the fine-tune
launcher step must not pay — it runs on the component image, which has torchtune's files but no torch
(images/component/Dockerfile). Three things are read here instead:

- the recipe registry (`torchtune/_recipe_registry.py` is plain dataclasses: loaded on its own, by path);
- the recipe config files (`recipes/configs/...` beside the package);
- the parameters of builders, tokenizers and other components, from their source (`ast`), following the
  package's re-exports (`from ._component_builders import lora_llama3_2`), as `inspect.signature` would give.

Checks that need torch itself (torchtune's `config.validate`, tokenizing rows) run first thing inside the
TrainJob (components/torchtune_finetune/entrypoint.py).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from kfp_finetune.components._shared.errors import ConfigError

PACKAGE = "torchtune"


@functools.cache
def package_dir() -> Path:
    """The installed torchtune package folder (found, not imported: `find_spec` of a top-level name runs no code)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "torchtune is not installed: pip install 'kfp-finetune[train]' (or torchtune==0.6.1 --no-deps to "
            "resolve configs without torch)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


@functools.cache
def _registry_module() -> ModuleType:
    path = package_dir() / "_recipe_registry.py"
    name = "kfp_finetune_torchtune_recipe_registry"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


def recipes() -> dict[str, Any]:
    """torchtune's recipes by name (`Recipe` objects: name, file_path, configs, supports_distributed)."""
    return {recipe.name: recipe for recipe in _registry_module().get_all_recipes()}


def recipe_file(name: str) -> Path:
    """The file of torchtune's recipe `name` (`recipes/` beside the package: not importable as a package)."""
    return package_dir().parent / "recipes" / recipes()[name].file_path


def config_file(file_path: str) -> Path:
    """A registry config's file (e.g. 'llama3_2/1B_lora_single_device.yaml')."""
    return package_dir().parent / "recipes" / "configs" / file_path


def written_world_size(config_path: Path) -> int:
    """The devices a base config was written for: the `--nproc_per_node N` of the launch command in its header
    comment (torchtune's distributed configs name 2, 4 or 8); 1 where it names none (single-device configs)."""
    try:
        header = [line for line in config_path.read_text().splitlines() if line.startswith("#")]
    except OSError:
        return 1
    found = re.search(r"--nproc_per_node[ =](\d+)", "\n".join(header))
    return int(found.group(1)) if found else 1


def parameters(dotted: str) -> dict[str, bool]:
    """The parameters of a torchtune (or kfp_finetune) function or class (its `__init__` without self), name -> has a default.

    Raises ConfigError when `dotted` is not found in torchtune's sources."""
    module, _, name = dotted.rpartition(".")
    found = _find_definition(module, name, depth=0)
    if found is None:
        raise ConfigError(f"{dotted} is not defined in the installed torchtune ({package_dir()})")
    return found


def constant(module: str, name: str) -> Any:
    """A module-level literal (e.g. a tokenizer's regex) of a torchtune module, read from its source."""
    path = _module_file(module)
    for node in _parse(path).body if path else []:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise ConfigError(f"{module}.{name} is not defined in the installed torchtune ({package_dir()})")


def module_names(module: str) -> list[str]:
    """The names a torchtune (or kfp_finetune) module defines or re-exports at its top level; [] when it has no
    file (for the nearest name to a misspelt `_component_`)."""
    path = _module_file(module)
    if path is None:
        return []
    return sorted(set(_top_level_names(_parse(path).body)))


def _top_level_names(body: list[ast.stmt]) -> list[str]:
    """Names bound by these statements, through top-level `try` / `if` blocks (version-dependent imports)."""
    names = []
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.ImportFrom):
            names += [alias.asname or alias.name for alias in node.names]
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                names += _top_level_names(block)
        elif isinstance(node, ast.If):
            names += _top_level_names(node.body) + _top_level_names(node.orelse)
    return names


def _module_file(module: str) -> Path | None:
    parts = module.split(".")
    if parts[0] != PACKAGE:
        # Our own wrappers (e.g. _shared/torchtune/tokenizer_builders.py): found through their (light) parent packages.
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            return None
        return Path(spec.origin) if spec is not None and spec.origin else None
    base = package_dir().joinpath(*parts[1:])
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _find_definition(module: str, name: str, depth: int) -> dict[str, bool] | None:
    path = _module_file(module)
    if path is None or depth > 8:
        return None
    tree = _parse(path)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return _arguments(node.args, skip_first=False)
        if isinstance(node, ast.ClassDef) and node.name == name:
            init = next(
                (n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None
            )
            return _arguments(init.args, skip_first=True) if init else {}
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
            and isinstance(node.value, (ast.Name, ast.Attribute))  # an alias: `x = other`
        ):
            return _find_definition(module, ast.unparse(node.value).rpartition(".")[2], depth + 1)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    source = _absolute(package, node.module, node.level)
                    found = _find_definition(source, alias.name, depth + 1)
                    if found is None:  # `from . import submodule`
                        continue
                    return found
    return None


def _absolute(package: str, module: str | None, level: int) -> str:
    if level == 0:
        return module or ""
    base = package.split(".")
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, *([module] if module else [])])


def _arguments(args: ast.arguments, skip_first: bool) -> dict[str, bool]:
    positional = [*args.posonlyargs, *args.args]
    with_default = {a.arg for a in positional[len(positional) - len(args.defaults) :]}
    with_default |= {a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None}
    names = [a.arg for a in positional][1 if skip_first else 0 :] + [a.arg for a in args.kwonlyargs]
    return {name: name in with_default for name in names}
