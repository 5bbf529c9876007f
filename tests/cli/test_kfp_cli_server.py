"""The KFP API server's 400s reach the user through the CLI, `run --wait/--follow`, and list-runtimes' devices.

Each server rule is exercised twice where the CLI checks it too: the CLI refuses before sending anything
(test_kfp_cli.py), and with the CLI's own check switched off the stand-in answers 400 as KFP 2.15 does
(tests/support/kfp_validation.py names the upstream source), the CLI shows the server's message and exits 1.
"""

from __future__ import annotations

import kfp
import kfp_server_api
import pytest
import yaml

from kfp_finetune.commands import kfp_backend as kb
from kfp_finetune.commands import schedule, values
from kfp_finetune.commands import upload as upload_command
from tests.cli import test_kfp_cli as kfp_cli_tests
from tests.cli.test_kfp_cli import FINETUNE_PARAMS, cli, seed_our_runtimes, upload
from tests.support import kfp_standin as kfp_support
from tests.support import kfp_validation
from tests.support import kube_standin as kube_support

kfp_standin = kfp_support.kfp_standin
kube_standin = kube_support.kube_standin
clean_environment = kfp_cli_tests.clean_environment  # autouse: no ambient KFP settings, a known token

PREP_VALUES = {"data_uri": "/d", "model_uri": "/m"}  # what prepare-inputs requires
PREP = [arg for k, v in PREP_VALUES.items() for arg in ("--param", f"{k}={v}")]
PARAMS = [arg for p in FINETUNE_PARAMS for arg in ("--param", p)]


@pytest.fixture
def no_cli_checks(monkeypatch):
    """Send parameters untyped and unchecked, so only the server judges them."""
    monkeypatch.setattr(
        kb, "typed_params", lambda given, spec, flag="--param": values.typed_params(given, None)
    )


# --- runtime parameters: v2_template.go validatePipelineJobInputs ---------------------------------------------


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (FINETUNE_PARAMS[:2], "parameter export_destination is not optional, yet has neither default value"),
        (
            [*FINETUNE_PARAMS, "lerning_rate=1"],
            "parameter(s) provided are not required by pipeline: lerning_rate",
        ),
        ([*FINETUNE_PARAMS, "tune_seed=seven"], "input parameter tune_seed requires type double or integer"),
        (
            [*FINETUNE_PARAMS, "tune_learning_rate=fast"],
            "input parameter tune_learning_rate requires type double",
        ),
        ([*FINETUNE_PARAMS, "data_type=7"], "input parameter data_type requires type string"),
        ([*FINETUNE_PARAMS, "export_overwrite=maybe"], "input parameter export_overwrite requires type bool"),
        (
            [*FINETUNE_PARAMS, "eval_lm_eval_tasks=hellaswag"],
            "input parameter eval_lm_eval_tasks requires type list",
        ),
        ([*FINETUNE_PARAMS, "tune_overrides=[a]"], "input parameter tune_overrides requires type struct"),
    ],
)
@pytest.mark.slow
def test_server_refuses_bad_runtime_parameters_and_the_cli_shows_it(
    capsys, kfp_standin, no_cli_checks, params, message
):
    code, _, err = cli(
        capsys,
        "run",
        "finetune-pipeline",
        "--host",
        kfp_standin.url,
        *[a for p in params for a in ("--param", p)],
    )
    assert code == 1, err
    assert "KFP answered 400" in err and message in err
    assert kfp_standin.runs == {}


@pytest.mark.slow
def test_server_takes_any_number_for_an_integer_parameter(capsys, kfp_standin, no_cli_checks):
    """Never stricter than upstream: v2_template.go checks only for a number value (the CLI refuses 1.5 itself)."""
    code, _, err = cli(
        capsys, "run", "finetune-pipeline", "--host", kfp_standin.url, *PARAMS, "--param", "tune_seed=1.5"
    )
    assert code == 0, err
    assert next(iter(kfp_standin.runs.values()))["runtime_config"]["parameters"]["tune_seed"] == 1.5


@pytest.mark.slow
def test_uploaded_version_parameters_are_checked_by_the_server(capsys, kfp_standin, no_cli_checks):
    upload(capsys, kfp_standin)
    code, _, err = cli(
        capsys, "run", "--pipeline", "finetune-pipeline", "--host", kfp_standin.url, *PARAMS[:4]
    )
    assert code == 1 and "parameter export_destination is not optional" in err


# --- names: v2_template.go NewV2SpecTemplate, run_server.go createRun ---------------------------------------


@pytest.fixture
def no_upload_name_check(monkeypatch):
    """Upload names unchecked by the CLI, so only the server judges them."""
    monkeypatch.setattr(upload_command, "check_names", lambda *args: None)


def _renamed(tmp_path, name: str, file_name: str = "renamed.yaml"):
    documents = kb.load_package("prepare-inputs", tmp_path).documents
    documents[0]["pipelineInfo"]["name"] = name
    source = tmp_path / file_name
    source.write_text(yaml.safe_dump_all(documents))
    return source


# (spec name, the server's message): v2_template.go `NewV2SpecTemplate` (an unanchored regexp: one lower-case
# letter or digit anywhere passes), then common/utils.go `ValidatePipelineName` (anchored, MLMD's rule).
BAD_SPEC_NAMES = [
    ("PREPARE_INPUTS", "name should consist of lower case alphanumeric characters"),
    ("Prepare Inputs", "pipeline's name must contain only lowercase alphanumeric characters or '-'"),
    ("prepare.inputs", "pipeline's name must contain only lowercase alphanumeric characters or '-'"),
    ("-prepare-inputs", "must start with alphanumeric characters"),
    ("p" * 129, "pipeline's name must contain no more than 128 characters"),
]


@pytest.mark.parametrize(("name", "message"), BAD_SPEC_NAMES, ids=[n[:20] for n, _ in BAD_SPEC_NAMES])
def test_upload_of_a_pipeline_with_an_invalid_name_is_refused_by_the_server(
    capsys, kfp_standin, tmp_path, no_upload_name_check, name, message
):
    source = _renamed(tmp_path, name)
    code, _, err = cli(capsys, "upload", str(source), "--name", "prepare-inputs", "--host", kfp_standin.url)
    assert code == 1
    assert "KFP answered 400" in err and message in err
    assert "error_details" not in err  # the upload server's api.Error body: its error_message is shown
    assert kfp_standin.pipelines == {}
    # A new version of an existing pipeline meets the same checks (resource_manager.go CreatePipelineVersion).
    client = kfp.Client(host=kfp_standin.url)
    pipeline = client.upload_pipeline(
        str(_renamed(tmp_path, "prepare-inputs", "good.yaml")), pipeline_name="prepare-inputs"
    )
    with pytest.raises(kfp_server_api.ApiException) as refused:
        client.upload_pipeline_version(str(source), "v2", pipeline_id=pipeline.pipeline_id)
    assert refused.value.status == 400 and message in refused.value.body


def test_a_run_of_an_inline_spec_meets_only_the_first_name_check(kfp_standin, tmp_path):
    """Never stricter than upstream: createRun builds the template (NewV2SpecTemplate) but never calls
    ValidatePipelineName, so a run of a spec named "Prepare Inputs" is taken."""
    client = kfp.Client(host=kfp_standin.url)
    source = _renamed(tmp_path, "Prepare Inputs")
    run = client.create_run_from_pipeline_package(str(source), arguments=PREP_VALUES, run_name="r1")
    assert run.run_id in kfp_standin.runs


def test_run_names_and_experiments_as_upstream():
    with kfp_support.KfpStandin() as standin:
        client = kfp.Client(host=standin.url)
        spec_path = str(kb.load_package("prepare-inputs", _tmp()).path)
        with pytest.raises(kfp_server_api.ApiException) as refused:
            client.run_pipeline("", job_name="", pipeline_package_path=spec_path, params=PREP_VALUES)
        assert refused.value.status == 400 and "The run name is empty" in refused.value.body
        # No experiment: the run goes to the "Default" experiment (resource_manager.go).
        run = client.run_pipeline("", job_name="r1", pipeline_package_path=spec_path, params=PREP_VALUES)
        experiment = standin.experiments[standin.runs[run.run_id]["experiment_id"]]
        assert experiment["display_name"] == "Default"
    with kfp_support.KfpStandin(multi_user=True) as standin:
        client = kfp.Client(host=standin.url, namespace="team-a")
        with pytest.raises(kfp_server_api.ApiException) as refused:
            client.run_pipeline("", job_name="r1", pipeline_package_path=spec_path, params=PREP_VALUES)
        assert (
            refused.value.status == 400
            and "Experiment id can not be empty in multi-user mode" in refused.value.body
        )


def _tmp():
    import tempfile

    return tempfile.mkdtemp(prefix="kfp-standin-")


# --- recurring runs: api_converter.go toModelJob, robfig/cron v1 --------------------------------------------


def test_server_refuses_an_unparsable_cron_and_the_cli_shows_it(capsys, kfp_standin, monkeypatch):
    monkeypatch.setattr(kb, "validate_cron", lambda expression: expression)
    code, _, err = cli(
        capsys, "schedule", "prepare-inputs", "--host", kfp_standin.url, *PREP,
        "--cron", "61 0 2 * * *",
    )  # fmt: skip
    assert code == 1
    assert "Schedule cron is not a supported format" in err and "End of range (61) above maximum (59)" in err
    assert kfp_standin.recurring_runs == {}


def test_server_refuses_max_concurrency_over_10_and_the_cli_shows_it(capsys, kfp_standin, monkeypatch):
    monkeypatch.setattr(schedule, "MAX_CONCURRENCY_LIMIT", 100)
    code, _, err = cli(
        capsys, "schedule", "prepare-inputs", "--host", kfp_standin.url, *PREP,
        "--cron", "0 0 2 * * *", "--max-concurrency", "11",
    )  # fmt: skip
    assert code == 1
    assert "Max concurrency of a recurring run must be at least 1 and at most 10. Received 11" in err


def test_recurring_run_triggers_modes_and_enable_disable_as_upstream(kfp_standin):
    client = kfp.Client(host=kfp_standin.url)
    experiment = client.create_experiment("nightly").experiment_id
    spec_path = str(kb.load_package("prepare-inputs", _tmp()).path)
    common = {"experiment_id": experiment, "pipeline_package_path": spec_path, "params": PREP_VALUES}
    # robfig/cron v1 takes 5 fields (day of week optional): accepted, even though the CLI refuses it.
    five = client.create_recurring_run(job_name="five", cron_expression="0 0 2 * *", **common)
    assert kfp_standin.recurring_runs[five.recurring_run_id]["status"] == "ENABLED"
    with pytest.raises(kfp_server_api.ApiException) as refused:
        client.create_recurring_run(job_name="negative", interval_second=-5, **common)
    assert refused.value.status == 400 and "Found invalid period schedule interval -5" in refused.value.body
    paused = client.create_recurring_run(job_name="paused", interval_second=3600, enabled=False, **common)
    record = kfp_standin.recurring_runs[paused.recurring_run_id]
    assert (record["status"], record["no_catchup"], record["max_concurrency"]) == ("DISABLED", False, "1")
    client.enable_recurring_run(paused.recurring_run_id)
    assert record["status"] == "ENABLED"
    client.disable_recurring_run(paused.recurring_run_id)
    assert record["status"] == "DISABLED"


def test_a_recurring_run_without_a_mode_is_disabled(kfp_standin):
    """api_converter.go `toModelJobEnabled`: MODE_UNSPECIFIED is disabled (kfp.Client always sends a mode, so this
    request is made by hand, as another client would)."""
    import json
    import urllib.request

    spec = kb.load_package("prepare-inputs", _tmp()).spec
    body = {
        "display_name": "no-mode", "pipeline_spec": spec, "max_concurrency": "1",
        "trigger": {"periodic_schedule": {"interval_second": "3600"}},
        "runtime_config": {"parameters": PREP_VALUES},
    }  # fmt: skip
    request = urllib.request.Request(
        f"{kfp_standin.url}/apis/v2beta1/recurringruns",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request) as answer:
        created = json.load(answer)
    assert (created["mode"], created["status"]) == ("DISABLE", "DISABLED")


@pytest.mark.parametrize(
    ("cron", "problem"),
    [
        ("0 0 2 * * *", None),
        ("0 2 * * *", None),  # 5 fields: day of week optional
        ("0 0 2 * * MON-FRI", None),
        ("*/15 * * * * ?", None),
        ("5/10 * * * * *", None),
        ("@daily", None),
        ("@every 1h30m", None),
        ("@every soon", "Failed to parse duration @every soon"),
        ("@sometimes", "Unrecognized descriptor: @sometimes"),
        ("* * * *", "Expected 5 to 6 fields, found 4"),
        ("0 0 2 * * * *", "Expected 5 to 6 fields, found 7"),
        ("0 60 * * * *", "End of range (60) above maximum (59)"),
        ("0 0 0 0 * *", "Beginning of range (0) below minimum (1)"),
        ("0 0 5-2 * * *", "Beginning of range (5) beyond end of range (2)"),
        ("0 0 */0 * * *", "Step of range should be a positive number"),
        ("0 0 x * * *", "Failed to parse int from x"),
    ],
)
def test_cron_rules_follow_robfig_cron_v1(cron, problem):
    found = kfp_validation.cron_problem(cron)
    assert (found is None) if problem is None else (problem in (found or "")), found


# --- run --wait / --follow ------------------------------------------------------------------------------------


def test_run_follow_prints_each_task_state_change_and_exits_0_on_success(capsys, kfp_standin):
    kfp_standin.plan_next_run(
        ("PENDING", None),
        ("RUNNING", {"dataset-initialize": "RUNNING"}),
        ("RUNNING", {"dataset-initialize": "RUNNING"}),  # nothing changed: nothing printed
        ("RUNNING", {"dataset-initialize": "SUCCEEDED", "model-initialize": "RUNNING"}),
        ("SUCCEEDED", {"dataset-initialize": "SUCCEEDED", "model-initialize": "SUCCEEDED"}),
    )
    code, out, err = cli(
        capsys, "run", "prepare-inputs", "--host", kfp_standin.url, *PREP,
        "--follow", "--poll-interval", "0",
    )  # fmt: skip
    assert code == 0, err
    lines = out.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith("url: ")) + 1
    assert lines[start:-1] == [
        "run: PENDING",
        "run: RUNNING",
        "task dataset-initialize: RUNNING",
        "task dataset-initialize: SUCCEEDED",
        "task model-initialize: RUNNING",
        "run: SUCCEEDED",
        "task model-initialize: SUCCEEDED",
    ]
    assert lines[-1].startswith("run prepare-inputs ") and lines[-1].endswith(" SUCCEEDED")
    assert len(kfp_standin.requests_for("GET", f"/apis/v2beta1/runs/{next(iter(kfp_standin.runs))}")) == 5


@pytest.mark.parametrize("final", ["FAILED", "CANCELED"])
def test_run_wait_exits_non_zero_naming_the_final_state(capsys, kfp_standin, final):
    kfp_standin.plan_next_run(
        ("RUNNING", {"dataset-initialize": "RUNNING"}), (final, {"dataset-initialize": final})
    )
    code, out, err = cli(
        capsys, "run", "prepare-inputs", "--host", kfp_standin.url, *PREP,
        "--wait", "--poll-interval", "0",
    )  # fmt: skip
    assert code == 1
    assert f"ended in state {final}" in err
    assert "task " not in out  # --wait alone prints no task lines


def test_run_without_wait_returns_at_once(capsys, kfp_standin):
    code, _, _ = cli(capsys, "run", "prepare-inputs", "--host", kfp_standin.url, *PREP)
    assert code == 0
    assert kfp_standin.requests_for("GET", f"/apis/v2beta1/runs/{next(iter(kfp_standin.runs))}") == []


# --- list-runtimes: nodes and devices per node ----------------------------------------------------------------


def test_list_runtimes_shows_nodes_and_devices_per_node(capsys, kube_standin):
    import json

    seed_our_runtimes(kube_standin)
    kube_standin.add_runtime(
        "big",
        num_nodes=4,
        resources={"requests": {"cpu": "8", "amd.com/gpu": "4"}, "limits": {"amd.com/gpu": "8"}},
    )
    kubeconfig = str(kube_standin.kubeconfig_path)
    code, out, err = cli(capsys, "list-runtimes", "--kubeconfig", kubeconfig, "-o", "json")
    assert code == 0, err
    rows = {row["name"]: row for row in json.loads(out)}
    assert (rows["torchtune"]["numNodes"], rows["torchtune"]["devicesPerNode"]) == (
        1,
        {"nvidia.com/gpu": "1"},
    )
    assert rows["torchtune-cpu"]["devicesPerNode"] == {}
    assert (rows["big"]["numNodes"], rows["big"]["devicesPerNode"]) == (4, {"amd.com/gpu": "8"})  # limits win
    code, out, _ = cli(capsys, "list-runtimes", "--kubeconfig", kubeconfig)
    table = {line.split()[1]: line.split() for line in out.splitlines()[1:]}
    assert table["big"][3:6] == ["4", "8", "amd.com/gpu"]
    assert table["torchtune"][3:6] == ["1", "1", "nvidia.com/gpu"]
    assert table["torchtune-cpu"][3:5] == ["1", "cpu"]


# --- recurring runs start as KFP's controller starts them (scheduledworkflow/util/*.go) -------------------------

HOUR = 3600


def _schedule(capsys, standin, *options: str) -> str:
    code, out, err = cli(capsys, "schedule", "prepare-inputs", "--host", standin.url, *PREP, *options)
    assert code == 0, err
    return next(iter(standin.recurring_runs))


def test_default_schedule_runs_once_for_missed_slots_and_one_at_a_time(capsys, kfp_standin):
    """The CLI's defaults (no catch-up, max concurrency 1): 3.5 hours behind starts one run, not three."""
    recurring = _schedule(capsys, kfp_standin, "--interval-seconds", str(HOUR))
    assert kfp_standin.tick(recurring, HOUR - 1) is None  # not due yet
    first = kfp_standin.tick(recurring, int(3.5 * HOUR))
    assert first and first["recurring_run_id"] == recurring
    created = kfp_standin.recurring_runs[recurring]["_created_epoch"]
    assert first["display_name"].endswith(
        f"-{created + int(3.5 * HOUR)}"
    )  # scheduled now, not at the 1st slot
    assert kfp_standin.tick(recurring, int(3.5 * HOUR)) is None  # nothing missed any more (and one is active)
    assert kfp_standin.tick(recurring, int(4.6 * HOUR)) is None  # due, but the first run is still active
    kfp_standin.set_run_state(first["run_id"], "SUCCEEDED")
    second = kfp_standin.tick(recurring, int(4.6 * HOUR))
    assert second and second["display_name"].endswith(f"-{created + int(4.5 * HOUR)}")
    assert len(kfp_standin.runs) == 2


def test_catchup_back_fills_each_missed_slot_up_to_max_concurrency(capsys, kfp_standin):
    recurring = _schedule(
        capsys, kfp_standin, "--interval-seconds", str(HOUR), "--catchup", "--max-concurrency", "2"
    )
    started = [kfp_standin.tick(recurring, int(3.5 * HOUR)) for _ in range(3)]
    assert [run is not None for run in started] == [True, True, False]  # the third waits for a free slot
    created = kfp_standin.recurring_runs[recurring]["_created_epoch"]
    assert [run["display_name"].rsplit("-", 1)[1] for run in started[:2]] == [
        str(created + HOUR),
        str(created + 2 * HOUR),
    ]
    kfp_standin.set_run_state(started[0]["run_id"], "FAILED")
    third = kfp_standin.tick(recurring, int(3.5 * HOUR))
    assert third and third["display_name"].endswith(str(created + 3 * HOUR))
    assert kfp_standin.tick(recurring, int(3.5 * HOUR)) is None


def test_a_disabled_schedule_starts_nothing_until_enabled(capsys, kfp_standin):
    recurring = _schedule(capsys, kfp_standin, "--interval-seconds", str(HOUR), "--disabled")
    assert kfp_standin.tick(recurring, 2 * HOUR) is None
    kfp.Client(host=kfp_standin.url).enable_recurring_run(recurring)
    assert kfp_standin.tick(recurring, 2 * HOUR)


def test_cron_schedule_runs_at_its_wall_clock_slot():
    from tests.support.kfp_schedule import cron_after, should_run

    midnight = 1_767_225_600  # 2026-01-01T00:00:00Z, a Thursday
    assert cron_after("0 0 2 * * *", midnight) == midnight + 2 * HOUR
    assert cron_after("0 0 2 * * *", midnight + 2 * HOUR) == midnight + 26 * HOUR
    assert cron_after("0 30 * * * MON", midnight) == midnight + 4 * 24 * HOUR + 1800  # Monday 00:30
    # 5 fields: day of week left out, so crontab's "0 2 * * *" (02:00) is second 0, minute 2 of every hour.
    assert cron_after("0 2 * * *", midnight) == midnight + 120
    assert cron_after("@every 90m", midnight) == midnight + 5400
    nightly = {
        "trigger": {"cron_schedule": {"cron": "0 0 2 * * *"}},
        "status": "ENABLED",
        "max_concurrency": "1",
    }
    three_days = midnight + 3 * 24 * HOUR + 3 * HOUR  # 3 slots missed
    assert should_run({**nightly, "no_catchup": True}, 0, None, midnight, three_days) == (
        midnight + 74 * HOUR,
        True,
    )
    assert should_run({**nightly, "no_catchup": False}, 0, None, midnight, three_days) == (
        midnight + 2 * HOUR,
        True,
    )
