"""The evaluate step's settings and their checks, here so that pre-flight checks the pipeline's eval_ parameters
with the same rules before anything is downloaded (a component imports only _shared)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kfp_finetune.components._shared.errors import SettingError

GENERATION_METRICS = ("exact_match", "token_f1", "rouge_l")
LOSS_METRICS = ("eval_loss", "perplexity")
#: A sequence classifier's scores (its eval_loss is the cross-entropy of each row's class).
CLASSIFICATION_METRICS = ("accuracy", "macro_f1")
#: The improvement's confidence interval must lie above 0 at this level for the gate to pass.
DEFAULT_CONFIDENCE = 0.95


@dataclass
class EvalSettings:
    max_samples: int = 200  # 0: every eval row
    batch_size: int = -1  # -1: by the device and the model (evaluate/placement.py eval_batch_size)
    max_new_tokens: int = 64
    max_seq_len: int = 0  # 0: the training run's (or no limit)
    seed: int = 0
    device: str = "auto"
    gate_metric: str = "eval_loss"
    min_improvement: float = 0.0
    confidence: float = DEFAULT_CONFIDENCE
    thresholds: dict[str, float] = field(default_factory=dict)
    lm_eval_tasks: list[str] = field(default_factory=list)
    lm_eval_limit: int = 0  # 0: every task example
    lm_eval_include_path: str = ""
    report_samples: int = 20

    def check(self) -> None:
        """Raise the first problem (a SettingError naming the setting)."""
        problems = self.problems()
        if problems:
            raise problems[0]

    def problems(self) -> list[SettingError]:
        """Every problem of these settings, each naming its setting."""
        found = []
        if self.max_new_tokens < 1:
            found.append(SettingError("max_new_tokens", f"must be at least 1 (got {self.max_new_tokens})"))
        if self.batch_size < 1 and self.batch_size != -1:
            found.append(
                SettingError("batch_size", f"must be at least 1, or -1 for auto (got {self.batch_size})")
            )
        for name in ("max_samples", "max_seq_len", "lm_eval_limit", "report_samples"):
            if getattr(self, name) < 0:
                found.append(SettingError(name, f"must be 0 or more (got {getattr(self, name)})"))
        if self.device not in ("auto", "cpu") and not self.device.startswith("cuda"):
            found.append(SettingError("device", f"must be auto, cpu or cuda[:N] (got {self.device!r})"))
        if not math.isfinite(self.min_improvement):
            found.append(
                SettingError("min_improvement", f"must be a finite number (got {self.min_improvement})")
            )
        if (
            not isinstance(self.confidence, (int, float))
            or isinstance(self.confidence, bool)
            or not (0 < self.confidence < 1)
        ):
            found.append(
                SettingError(
                    "confidence",
                    f"must be a number between 0 and 1, exclusive (got {self.confidence!r}): e.g. 0.95 for a 95% "
                    "confidence interval on the improvement",
                )
            )
        # lm-eval metric names are known only after the tasks ran; the others are checked before any work.
        known = (*LOSS_METRICS, *GENERATION_METRICS, *CLASSIFICATION_METRICS)
        for name, metrics in (("gate_metric", [self.gate_metric]), ("thresholds", list(self.thresholds))):
            unknown = [m for m in metrics if m not in known and not m.startswith("lm_eval_")]
            if unknown:
                found.append(
                    SettingError(
                        name,
                        f"names unknown metric(s) {', '.join(unknown)}: use {', '.join(known)} or "
                        "lm_eval_<task>_<metric>",
                    )
                )
        bad = {
            k: v for k, v in self.thresholds.items() if not isinstance(v, (int, float)) or isinstance(v, bool)
        }
        if bad:
            found.append(
                SettingError("thresholds", f"values must be numbers, e.g. {{'exact_match': 0.5}} (got {bad})")
            )
        return found

    def check_scored(self, classifier: bool) -> None:
        """Refuse a gate metric or threshold the model cannot be scored on (a classifier generates no text; a
        language model predicts no classes), before any model is loaded."""
        unscored = (*GENERATION_METRICS, "perplexity") if classifier else CLASSIFICATION_METRICS
        scored = (
            ("eval_loss", *CLASSIFICATION_METRICS) if classifier else (*LOSS_METRICS, *GENERATION_METRICS)
        )
        kind = "a sequence classifier" if classifier else "a language model"
        for name, metrics in (("gate_metric", [self.gate_metric]), ("thresholds", list(self.thresholds))):
            wrong = [m for m in metrics if m in unscored]
            if wrong:
                raise SettingError(name, f"names {', '.join(wrong)}, which {kind} is not scored on: use "
                                         f"{', '.join(scored)}")  # fmt: skip
