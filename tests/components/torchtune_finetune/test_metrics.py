"""The step's progress line (progress.py)."""

from kfp_finetune.components._shared.metrics_file import StepMetrics
from kfp_finetune.components.torchtune_finetune.progress import ProgressClock


def test_the_progress_line_names_the_lr_it_shows_as_the_next_steps():
    """torchtune logs the lr after the scheduler's step: at step 1 of a warmup, the rate step 2 trains with."""
    line = ProgressClock(total_steps=1).update(StepMetrics(step=1, values={"loss": 2.5, "lr": 3e-4})).line()
    assert line == "progress: step 1/1 | loss 2.5000 | next step's lr 0.0003"
