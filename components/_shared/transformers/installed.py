"""What the installed transformers can build, read from its files without importing it (importing its model
registry imports torch, which the component image running pre-flight and the launcher does not have)."""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
from pathlib import Path

from kfp_finetune.components._shared.engines import CLASSIFICATION, GENERATION, IMAGE_TEXT

#: The auto mapping (models/auto/modeling_auto.py) of the model classes each task trains.
MAPPINGS = {
    GENERATION: "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    CLASSIFICATION: "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    IMAGE_TEXT: "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
}


def version() -> str | None:
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=len(MAPPINGS))
def model_classes(task: str = GENERATION) -> dict[str, str]:
    """model_type -> the class transformers builds for `task` (a causal LM, a sequence classifier, a vision-language model) by its auto
    mapping (models/auto/modeling_auto.py); {} when transformers is not installed."""
    mapping = MAPPINGS[task]
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return {}
    source = Path(spec.submodule_search_locations[0]) / "models" / "auto" / "modeling_auto.py"
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == mapping for t in node.targets):
            pairs = node.value.args[0] if isinstance(node.value, ast.Call) else node.value
            return dict(ast.literal_eval(pairs))
    raise RuntimeError(f"{source} no longer defines {mapping}: this transformers version is not supported")
