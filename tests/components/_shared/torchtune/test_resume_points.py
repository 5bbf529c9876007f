"""Resume checkpoints in a run folder (resume.py), the metrics file across a resume (metrics_file.py) and the
resolved YAML's checkpoint block (resolve.py): torch-free rules, each proven on files."""

import json

import pytest

from kfp_finetune.components._shared.errors import SettingError
from kfp_finetune.components._shared.metrics_file import collect_steps, resume_points
from kfp_finetune.components._shared.torchtune import resume
from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig


def _point(step, sha="abc", reason="interval"):
    return resume.new_point(step=step, epoch=0, batches_in_epoch=step, reason=reason, config_sha256=sha)


def _publish(run_dir, step, **kwargs):
    partial = resume.partial_dir(run_dir, step)
    partial.mkdir(parents=True)
    (partial / "state.pt").write_bytes(b"state")
    return resume.publish(partial, _point(step, **kwargs))


def test_the_newest_complete_checkpoint_is_the_one_resumed(tmp_path):
    assert resume.latest(tmp_path) is None
    _publish(tmp_path, 2)
    final = _publish(tmp_path, 4, reason="SIGTERM")
    point = resume.latest(tmp_path)
    assert (point.step, point.reason, point.path) == (4, "SIGTERM", final)
    # Only the newest is kept: the disk holds one training state.
    assert [p.name for p in resume.resume_root(tmp_path).iterdir()] == ["step_00000004"]


def test_a_checkpoint_without_its_marker_is_never_resumed(tmp_path):
    _publish(tmp_path, 2)
    # Killed while writing step 6: its files are there, its marker is not.
    partial = resume.partial_dir(tmp_path, 6)
    partial.mkdir(parents=True)
    (partial / "state.pt").write_bytes(b"half")
    # A folder named like a complete one but with no (or a foreign) marker is not complete either.
    (resume.checkpoint_dir(tmp_path, 8)).mkdir()
    (resume.checkpoint_dir(tmp_path, 9)).mkdir()
    (resume.checkpoint_dir(tmp_path, 9) / resume.MARKER).write_text(json.dumps({"something": "else"}))
    assert resume.latest(tmp_path).step == 2
    # The next complete checkpoint clears the debris.
    _publish(tmp_path, 10)
    assert [p.name for p in resume.resume_root(tmp_path).iterdir()] == ["step_00000010"]


def test_checkpoint_settings_round_trip_through_the_resolved_yaml_block():
    settings = resume.CheckpointSettings(
        "lora_finetune_single_device", resume=False, every_steps=5, every_minutes=0
    )
    again = resume.CheckpointSettings.from_config({resume.CONFIG_KEY: settings.as_config()})
    assert again == settings
    assert not again.checkpoints  # resume off: nothing is saved that nothing would read


def test_steps_trained_again_after_a_resume_replace_the_first_ones():
    lines = [
        "Step 1 | loss:3.0 lr:0.1",
        "Step 2 | loss:2.0 lr:0.1",
        "Step 3 | loss:9.0 lr:0.1",  # logged after the checkpoint at step 2, then killed
        "Resumed after step 2 (from the checkpoint saved on SIGTERM)",
        "Step 3 | loss:1.5 lr:0.1",
        "Step 4 | loss:1.0 lr:0.1",
    ]
    steps = collect_steps(lines)
    assert [(s.step, s.loss) for s in steps] == [(1, 3.0), (2, 2.0), (3, 1.5), (4, 1.0)]
    assert resume_points(lines) == [2]
    # Killed before the first checkpoint: the run started over, and so does its curve.
    restart = ["Step 1 | loss:5.0", "Resumed after step 0 (no complete checkpoint: training started over)",
               "Step 1 | loss:4.0"]  # fmt: skip
    assert [(s.step, s.loss) for s in collect_steps(restart)] == [(1, 4.0)]


@pytest.mark.parametrize("name", ["checkpoint_every_steps", "checkpoint_every_minutes"])
def test_a_negative_interval_is_refused_by_name(name):
    with pytest.raises(SettingError, match=name):
        TorchtuneConfig(**{name: -2}).check()


@pytest.mark.slow
def test_the_resolved_yaml_names_our_recipe_module_and_its_settings(tiny_llama, tiny_dataset, tmp_path):
    from kfp_finetune.components._shared.torchtune.resolve import resolve_run

    def block(**settings):
        cfg = TorchtuneConfig(device="cpu", **settings)
        return resolve_run(cfg, tiny_llama, tiny_dataset["train.jsonl"], tmp_path / "run").config[
            resume.CONFIG_KEY
        ]

    assert block() == {"recipe": "lora_finetune_single_device", "resume": True, "checkpoint_every_steps": 0,
                       "checkpoint_every_minutes": resume.DEFAULT_EVERY_MINUTES}  # fmt: skip
    assert block(resume=False, checkpoint_every_steps=10, checkpoint_every_minutes=0, method="full") == {
        "recipe": "full_finetune_single_device", "resume": False, "checkpoint_every_steps": 10,
        "checkpoint_every_minutes": 0.0}  # fmt: skip
