"""The fine-tune step's HTML report (its `report` output): the curves, results, speed, settings and the defaults
chosen with their reasons. torchtune's runs show their resolved YAML; a run its wing planned (planned_run.py) its
settings and the wing's choices.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import yaml

from kfp_finetune.components._shared import html_report
from kfp_finetune.components._shared.engines import EngineChoice
from kfp_finetune.components._shared.metrics_file import StepMetrics
from kfp_finetune.components._shared.torchtune.resolve import ResolvedRun
from kfp_finetune.components.torchtune_finetune.outputs import FinalCheckpoint
from kfp_finetune.components.torchtune_finetune.throughput import Throughput


def curves(steps: list[StepMetrics], resumed: list[int] | None, lr_title: str) -> str:
    """Loss, learning rate and (where logged) tokens/s by step, after a line naming where training resumed."""
    charts = [
        html_report.line_chart("training loss", {"loss": [(s.step, s.loss) for s in steps if s.loss is not None]}, "step"),
        html_report.line_chart(lr_title, {"lr": [(s.step, s.values["lr"]) for s in steps if "lr" in s.values]}, "step"),
    ]  # fmt: skip
    if any(s.tokens_per_second for s in steps):
        charts.append(html_report.line_chart(
            "tokens/s", {"tokens/s": [(s.step, s.tokens_per_second) for s in steps if s.tokens_per_second]}, "step"))  # fmt: skip
    return html_report.section(
        "Curves", f'{_resume_note(resumed)}<div class="charts">{"".join(charts)}</div>'
    )


def _resume_note(resumed: list[int] | None) -> str:
    if not resumed:
        return ""
    points = ", ".join("the start (no checkpoint yet)" if step == 0 else f"step {step}" for step in resumed)
    return f"<p>Training was interrupted and continued from {html_report.escape(points)}.</p>"


def torchtune_report(
    run: ResolvedRun,
    steps: list[StepMetrics],
    metrics: dict,
    model_metadata: dict,
    throughput: Throughput | None = None,
    resumed: list[int] | None = None,
) -> str:
    """`resumed`: the steps training resumed after (a retry, replaced pods; 0: started over), shown by the curves."""
    c = run.config
    model = c.get("model", {})
    settings = [
        ("recipe", run.recipe),
        ("base config", run.config_name or "user file"),
        ("method", model_metadata["method"]),
        ("base model", model_metadata["base_model"]),
        ("dataset", model_metadata["dataset_source"] or ", ".join(c["dataset"].get("data_files", [])[:2])),
        ("epochs / max steps per epoch", f"{c.get('epochs')} / {c.get('max_steps_per_epoch')}"),
        ("batch size x grad accumulation", f"{c.get('batch_size')} x {c.get('gradient_accumulation_steps')}"),
        ("optimizer", f"{c['optimizer'].get('_component_')} lr={c['optimizer'].get('lr')}"),
        ("lr scheduler", (c.get("lr_scheduler") or {}).get("_component_", "none")),
        ("device / dtype", f"{c.get('device')} / {c.get('dtype')}"),
    ]
    if "lora_rank" in model:
        settings.append(("LoRA rank / alpha / modules", f"{model['lora_rank']} / {model['lora_alpha']} / "
                         f"{', '.join(model['lora_attn_modules'])}{' + mlp' if model.get('apply_lora_to_mlp') else ''}"))  # fmt: skip
    results = [(name, value) for name, value in metrics.items()]
    rows = throughput.rows() if throughput else []
    speed = [html_report.section("Throughput", html_report.table(["measure", "value"], rows))] if rows else []
    defaults = [c for c in run.defaults if not c.warning]
    warnings = [c for c in run.defaults if c.warning]
    chosen = [
        html_report.section(
            "Defaults chosen",
            html_report.table(["setting", "value", "reason"], [(c.setting, c.value, c.reason) for c in defaults]),
        )
    ] if defaults else []  # fmt: skip
    # Settings the user gave that plan a run which may not learn: first, where nobody misses them.
    warned = [
        html_report.section(
            "Warnings",
            html_report.table(["setting", "value", "warning"], [(c.setting, c.value, c.reason) for c in warnings]),
        )
    ] if warnings else []  # fmt: skip
    return html_report.page(
        "torchtune fine-tune",
        f"{run.recipe} on {model_metadata['base_model']} — {len(steps)} steps",
        [
            *warned,
            # torchtune logs the lr after the scheduler's step: at step N, the rate step N + 1 trains with.
            curves(steps, resumed, "learning rate of the next step"),
            html_report.section("Results", html_report.table(["metric", "value"], results)),
            *speed,
            html_report.section("Settings", html_report.table(["setting", "value"], settings)),
            *chosen,
            html_report.section(
                "Resolved torchtune config",
                f"<pre>{html_report.escape(yaml.safe_dump(c, sort_keys=False))}</pre>",
            ),
        ],
    )


def planned_report(
    choice: EngineChoice,
    plan: Any,
    steps: list[StepMetrics],
    metrics: dict[str, float],
    model_metadata: dict,
    checkpoint: FinalCheckpoint,
    resolved: dict,
    resumed: list[int] | None = None,
) -> str:
    """The report of a run its engine's wing planned; `resolved` is the wing's resolved config."""
    settings = [(name, json.dumps(value)) for name, value in asdict(plan.settings).items()]
    outputs = [("merged", str(checkpoint.merged_dir or "")), ("adapter", str(checkpoint.adapter_dir or ""))]
    # What the training process chose for the settings left to it, and why.
    chosen = [(c["setting"], json.dumps(c["value"]), c["reason"]) for c in resolved.get("choices", [])]
    return html_report.page(
        f"{choice.engine} fine-tune",
        f"{model_metadata['method']} on {model_metadata['base_model']} — {len(steps)} steps",
        [
            html_report.section("Engine", html_report.escape(choice.line())),
            # transformers' Trainer logs the rate each step trained with (read before its scheduler's step).
            curves(steps, resumed, "learning rate"),
            html_report.section("Results", html_report.table(["metric", "value"], list(metrics.items()))),
            html_report.section("Outputs", html_report.table(["folder", "path"], outputs)),
            html_report.section("Settings", html_report.table(["setting", "value"], settings)),
            html_report.section("Defaults chosen", html_report.table(["setting", "value", "why"], chosen)),
        ],
    )
