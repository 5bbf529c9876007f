"""The transformers engine's face: what the steps above the wings may ask of a run it trained (see
_shared/torchtune/face.py for the names every face has).

- `read_resolved_config(run_dir)`: the settings the run trained with, `trl_config.json` ({} when absent);
- `last_adapter_state(run_dir)`: the run's PEFT adapter folder, None for a full fine-tune;
- `merged_model_dir(run_dir, base_dir)`: the HF folder of the base with the adapter merged in, built once.

Not yet here: `evaluation()` (scoring eval rows as this engine tokenized them). Until it is, the wing is not
registered in engines.WINGS, so no step can pick it and find the face incomplete.

No torch here: the merge imports it when called.
"""

from __future__ import annotations

from kfp_finetune.components._shared.transformers.run_layout import (
    last_adapter_state,
    merged_model_dir,
    read_resolved_config,
)

NAME = "transformers"
#: The installed packages only this wing imports (tests/components/test_engine_wings.py). transformers and peft
#: are not exclusive: the torchtune wing's parity checks use them too.
PACKAGES = ("trl",)

__all__ = ["NAME", "PACKAGES", "last_adapter_state", "merged_model_dir", "read_resolved_config"]
