"""The torchtune engine's run planning, shared by the steps that plan a run: the typed settings (config.py),
the resolver that writes one complete torchtune YAML (resolve.py), the data-derived defaults (defaults.py) and the
prompt-fit check (prompt_fit.py). Pre-flight resolves with them before anything is downloaded; the fine-tune step
resolves the run it launches. None of them imports torch. The builders a resolved YAML names are here too
(lr_schedule.py, and over torchtune's own builders: sample_packing.py, flex_attention.py); they import torch only
when the trainer calls them."""
