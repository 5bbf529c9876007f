"""A local lm-eval task over the tiny kit's rows: its data lies on disk, so lm-eval scores it offline."""

from __future__ import annotations

from pathlib import Path

TASK = "kfp_tiny"
# The metric the gate reads: a language model that learned the rows gives their answers a lower perplexity.
GATE_METRIC = f"lm_eval_{TASK}_perplexity"


def write_task(tasks_dir: Path, rows_jsonl: Path, datasets_cache: Path | None = None) -> Path:
    """`tasks_dir/kfp_tiny.yaml`: loglikelihood of each row's output after its input (acc and perplexity);
    `datasets_cache` keeps the datasets cache of a step that cannot set HF_HOME before datasets is imported."""
    cache = f", cache_dir: {datasets_cache}" if datasets_cache else ""
    tasks_dir.mkdir(parents=True, exist_ok=True)
    (tasks_dir / f"{TASK}.yaml").write_text(
        f"task: {TASK}\n"
        "dataset_path: json\n"
        f"dataset_kwargs: {{data_files: {{test: {rows_jsonl}}}{cache}}}\n"
        "test_split: test\n"
        "output_type: loglikelihood\n"
        'doc_to_text: "{{input}}\\n"\n'
        'doc_to_target: "{{output}}"\n'
        "metric_list:\n"
        "  - {metric: acc, aggregation: mean, higher_is_better: true}\n"
        "  - {metric: perplexity, aggregation: perplexity, higher_is_better: false}\n"
    )
    return tasks_dir
