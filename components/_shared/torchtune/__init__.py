"""The torchtune engine's run planning, shared by the steps that plan a run: the typed settings (config.py),
the resolver that writes one complete torchtune YAML (resolve.py), the data-derived defaults (defaults.py) and the
prompt-fit check (prompt_fit.py). Pre-flight resolves with them before anything is downloaded; the fine-tune step
resolves the run it launches. None of them imports torch; nor do the proven table (parity_cases.py) and its docs
(families_doc.py). Where torch runs: the checkpointer and its conversions, the builders that correct torchtune
0.6.1 (gemma2.py, qwen2.py, dora.py) and the logit-parity measurement (parity.py)."""
