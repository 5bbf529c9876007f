"""The torchtune engine's run planning, shared by the steps that plan a run: the typed settings (config.py),
the resolver that writes one complete torchtune YAML (resolve.py), the data-derived defaults (defaults.py) and the
prompt-fit check (prompt_fit.py). Pre-flight resolves with them before anything is downloaded; the fine-tune step
resolves the run it launches. None of them imports torch; nor do the proven table (parity_cases.py) and its docs
(families_doc.py). The builders a resolved YAML names are here too (lr_schedule.py; over torchtune's own builders:
sample_packing.py, flex_attention.py; correcting torchtune 0.6.1: gemma2.py, qwen2.py, dora.py), with the
checkpointer and its conversions and the logit-parity measurement (parity.py): those import torch only when the
trainer calls them."""
