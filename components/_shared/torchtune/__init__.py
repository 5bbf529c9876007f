"""The torchtune engine's run planning, shared by the steps that plan a run: the typed settings (config.py),
the resolver that writes one complete torchtune YAML (resolve.py), the data-derived defaults (defaults.py) and the
prompt-fit check (prompt_fit.py). Pre-flight resolves with them before anything is downloaded; the fine-tune step
resolves the run it launches. None of them imports torch."""
