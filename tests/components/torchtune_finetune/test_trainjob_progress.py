"""The launcher keeps the TrainJob's progress annotations current from the rank-0 log (against the stand-in)."""

import pytest

from kfp_finetune.components.torchtune_finetune import progress as pg
from tests.components.torchtune_finetune import test_trainjob_launcher as base
from tests.support.kube_standin import Scenario

pytestmark = pytest.mark.slow  # a Kubernetes stand-in per test

NAME = base.NAME
kube = base.kube


def test_the_trainjob_shows_how_far_training_is(kube):
    lines = [f"Step {i} | loss:{2.0 / i} lr:0.0001" for i in range(1, 5)]
    kube.scenario(None, Scenario.success(lines))
    result = base.launcher(kube, cleanup="never", total_steps=4).run()
    assert result.status == "Complete"
    annotations = kube.trainjob(NAME)["metadata"]["annotations"]
    # The first step and the last are always written; the ones between only once a minute has passed.
    assert annotations[pg.ANNOTATION_PERCENT] == "100"
    assert annotations[pg.ANNOTATION_PROGRESS].startswith("100% | step 4/4 | loss 0.5000")
    patches = [r for r in kube.requests_for("PATCH", "trainjobs") if "progress" in str(r.body)]
    assert len(patches) == 2
