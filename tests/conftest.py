import builtins
import contextlib
import logging
import os
import shutil
import subprocess

import pytest

# Tests never reach the internet: nothing may be fetched from a real hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

# Each test worker gets its share of the cores for torch's intra-op threads (here and in every process it starts:
# the variable is inherited). Left at torch's default, every worker's training runs as many OpenMP threads as the
# machine has cores, and two workers' threads spin against each other: a tiny run took 9x as long as alone.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // _WORKERS)))

# The files that take longest on two cores (per-file totals of a whole run's --junitxml times, every file over 20 s),
# dispatched to the workers first and in this order; the Makefile's `--no-loadscope-reorder` keeps it. xdist's own
# order (most tests first) left the few-test end-to-end files for last, and one worker ran the last of them alone
# while the other idled; a long file left off this list does the same.
LONGEST_FILES = (
    "tests/pipelines/test_families_and_data_shapes_pipeline.py",
    "tests/components/torchtune_finetune/test_training.py",
    "tests/components/torchtune_finetune/test_transformers_trainjob.py",
    "tests/pipelines/test_pipelines.py",
    "tests/pipelines/test_ecosystem_pipeline.py",
    "tests/components/torchtune_finetune/test_finetune_trainjob_preemption.py",
    "tests/components/torchtune_finetune/test_resume.py",
    "tests/pipelines/test_transformers_engine_pipeline.py",
    "tests/cli/test_readme_commands.py",
    "tests/deploy/test_images.py",
    "tests/pipelines/test_composition.py",
    "tests/components/_shared/transformers/test_train.py",
    "tests/components/torchtune_finetune/test_light_launcher.py",
    "tests/components/torchtune_finetune/test_resume_distributed.py",
    "tests/components/torchtune_finetune/test_planned_run.py",
    "tests/components/torchtune_finetune/test_trainjob_launcher.py",
    "tests/components/torchtune_finetune/test_finetune_trainjob.py",
    "tests/components/evaluate/test_evaluate.py",
    "tests/components/_shared/torchtune/test_merge.py",
    "tests/components/_shared/torchtune/test_parity.py",
    "tests/components/_shared/test_integrity.py",
    "tests/benchmarks/test_bench_gpu_suite.py",
    "tests/components/export/test_export.py",
    "tests/components/_shared/test_tracking.py",
    "tests/cli/test_cli.py",
    "tests/components/torchtune_finetune/test_warm_start.py",
    "tests/components/_shared/test_contract.py",
    "tests/components/test_planted_secrets.py",
    "tests/components/_shared/torchtune/families/test_gemma3.py",
    "tests/components/torchtune_finetune/test_lease.py",
    "tests/pipelines/test_multimodal_pipeline.py",
    "tests/components/torchtune_finetune/test_learns.py",
    "tests/components/torchtune_finetune/test_entrypoint.py",
    "tests/pipelines/test_classification_pipeline.py",
    "tests/components/torchtune_finetune/test_network_probe.py",
    "tests/cli/test_kfp_cli.py",
)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """The call phase's report on the item (`call_report`), for fixtures that add to a failed test's report."""
    report = yield
    if report.when == "call":
        item.call_report = report
    return report


def pytest_collection_modifyitems(items):
    def rank(item):
        path = item.nodeid.split("::", 1)[0]
        return LONGEST_FILES.index(path) if path in LONGEST_FILES else len(LONGEST_FILES)

    items.sort(key=rank)  # stable: the rest keep their collection order


@contextlib.contextmanager
def root_logger_restored():
    """Libraries called in-process (e.g. KFP's executor) may configure the root logger; a handler bound to one
    test's captured stdout must not leak log lines into a later test's stdout."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.fixture(autouse=True)
def _root_logger_restored():
    with root_logger_restored():
        yield


_PRINT = builtins.print


@pytest.fixture(autouse=True)
def _print_restored():
    """kfp.local indents a step's output by swapping `builtins.print` (kfp/local/logging_utils.py indented_print);
    two of its context managers interleaved in threads can restore each other's indenting print, which then leaks
    into every later test of the same process (seen as resolve-config output indented by 4 spaces)."""
    yield
    builtins.print = _PRINT


@pytest.fixture
def workspace(tmp_path):
    """An empty KFP run workspace directory."""
    path = tmp_path / "workspace"
    path.mkdir()
    return path


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder no file can be created in: mode 0o555, and immutable (`chattr +i`) where the tests run as root,
    whom modes do not stop (as a read-only volume would). Skipped where root cannot make it immutable."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    as_root = os.geteuid() == 0
    if as_root and not (
        shutil.which("chattr")
        and subprocess.run(["chattr", "+i", folder], capture_output=True).returncode == 0
    ):
        folder.chmod(0o755)
        pytest.skip("running as root on a filesystem without immutable files: no folder is read-only to root")
    yield folder
    if as_root:
        subprocess.run(["chattr", "-i", folder], check=True)
    folder.chmod(0o755)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    """A tiny Llama-3.2-architecture model (dim 64), built once per session. Treat as read-only."""
    from kfp_finetune.tiny.model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama3_2", family="llama3_2")


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory):
    """A tiny Qwen2.5-architecture model (dim 64). Treat as read-only."""
    from kfp_finetune.tiny.model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen2_5", family="qwen2_5")


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory):
    """A tiny Qwen3-architecture model (dim 64, head_dim 32, non-trivial q/k norms). Treat as read-only."""
    from kfp_finetune.tiny.model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen3", family="qwen3")


@pytest.fixture(scope="session")
def tiny_gemma3(tmp_path_factory):
    """A tiny Gemma-3-architecture model (dim 64, head_dim 32, a local and a global layer, window 16, non-trivial
    q/k norms, a SentencePiece tokenizer.model). Treat as read-only."""
    from kfp_finetune.tiny.model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-gemma3", family="gemma3")


@pytest.fixture(scope="session")
def tiny_smollm2(tmp_path_factory):
    """A tiny SmolLM2-architecture model (dim 64, tied, plain RoPE; tokenizer.json only). Treat as read-only."""
    from kfp_finetune.tiny.model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-smollm2", family="smollm2")


@pytest.fixture(scope="session")
def tiny_mistral_nemo(tmp_path_factory):
    """A tiny Mistral-Nemo-architecture model (dim 64, head_dim 8 below hidden / heads, untied; Tekken-style
    tokenizer.json only). Treat as read-only."""
    from kfp_finetune.tiny.model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-mistral_nemo", family="mistral_nemo")


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    """The synthetic instruct dataset: {"train.jsonl": path, "eval.jsonl": ..., "*.parquet": ...}."""
    from kfp_finetune.tiny.dataset import build_tiny_dataset

    return build_tiny_dataset(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="session")
def component_pipeline_run(tmp_path_factory):
    """One kfp.local run of the components' test DAG (tests/support/component_pipeline.py) on a tiny model, for
    every test worker of the session; the finetune, evaluate and export component tests each check their step's
    outputs of it."""
    from tests.support.component_pipeline import shared_run

    # The session's folder above the workers' own (pytest-N/ above pytest-N/popen-gwK/) under xdist.
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    # Set up before any test's own logger guard (session scope), so it needs its own.
    with root_logger_restored():
        return shared_run(root / "component-pipeline")


@pytest.fixture
def log_lines():
    """Messages logged by kfp_finetune (its root logger does not propagate to pytest's caplog)."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    handler = Collect()
    logger = logging.getLogger("kfp_finetune")
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)
