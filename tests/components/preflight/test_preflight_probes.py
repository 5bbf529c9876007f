"""Pre-flight's probe at the export destination is gone even when its pre-flight is killed between writing and
deleting it: the next pre-flight at that destination removes probes older than PROBE_STALE_AFTER_SECONDS (their
name says when they were made), and nothing else: not a probe another run is writing now, not a user's file that
is named alike. S3 against moto's server with a pre-flight really killed (SIGKILL); a local folder likewise."""

import os
import subprocess
import sys
import textwrap
import time

import boto3
import pytest

from kfp_finetune.components._shared.storage.names import PROBE_STALE_AFTER_SECONDS, is_stale_probe
from kfp_finetune.components.preflight.preflight import run_preflight
from tests.support.sources import ROOT

LOCAL = {"tune_backend": "local"}
AN_HOUR_AGO = int(time.time()) - 3600
# A user's files next to the probes, named alike: none is a probe's exact name, or it is not directly in the folder.
USERS = [
    ".kfp-finetune-probe-notes.txt",
    f"kfp-finetune-probe-{AN_HOUR_AGO}-0123456789ab",
    f".kfp-finetune-probe-{AN_HOUR_AGO}-0123456789ab.bak",
    f".kfp-finetune-probe-{AN_HOUR_AGO}-0123456789AB",
    f"sub/.kfp-finetune-probe-{AN_HOUR_AGO}-0123456789ab",
]
KILLED_PREFLIGHT = """
    import sys
    from kfp_finetune.components.preflight.preflight import run_preflight
    run_preflight(export_destination=sys.argv[1], s3_endpoint_url=sys.argv[2], tune_backend="local")
"""


def objects(bucket, prefix: str) -> dict[str, bytes]:
    listed = bucket.list_objects_v2(Bucket="models", Prefix=prefix).get("Contents", [])
    return {
        o["Key"][len(prefix) :]: bucket.get_object(Bucket="models", Key=o["Key"])["Body"].read()
        for o in listed
    }


@pytest.mark.slow
def test_the_probe_of_a_killed_preflight_is_removed_by_the_next_one_and_nothing_else(s3):
    bucket = boto3.client("s3", endpoint_url=s3.upstream)  # the test's own view, not through the proxy
    destination, folder = "s3://models/team/tuned", "team/tuned/"
    for name in USERS:
        bucket.put_object(Bucket="models", Key=folder + name, Body=f"user data {name}".encode())

    # A pre-flight killed after writing its probe, before deleting it: its DELETE is held at the proxy.
    s3.barrier(count=2, method="DELETE", timeout=3600)
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(KILLED_PREFLIGHT), destination, s3.url],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    deadline = time.monotonic() + 120
    while s3.peak < 1:
        assert child.poll() is None and time.monotonic() < deadline, "the pre-flight never reached its DELETE"
        time.sleep(0.05)
    child.kill()
    child.wait()
    s3.barrier(count=1, method="DELETE")  # later DELETEs pass; the killed one stays held, never sent on
    (left,) = set(objects(bucket, folder)) - set(USERS)
    assert left.startswith(".kfp-finetune-probe-") and not is_stale_probe(left, time.time())

    # Right away, the next pre-flight cannot tell it from another run's probe in flight: it is kept.
    run_preflight(export_destination=destination, s3_endpoint_url=s3.url, **LOCAL)
    assert set(objects(bucket, folder)) == {*USERS, left}

    # Once it is older than PROBE_STALE_AFTER_SECONDS (here: the same probe, made an hour earlier) it goes.
    made = int(left.split("-")[3])
    older = left.replace(f"-{made}-", f"-{made - PROBE_STALE_AFTER_SECONDS - 60}-")
    bucket.copy_object(
        Bucket="models", Key=folder + older, CopySource={"Bucket": "models", "Key": folder + left}
    )
    bucket.delete_object(Bucket="models", Key=folder + left)
    run_preflight(export_destination=destination, s3_endpoint_url=s3.url, **LOCAL)
    assert objects(bucket, folder) == {name: f"user data {name}".encode() for name in USERS}
    deleted = [p.split("?")[0] for m, p, status in s3.requests if m == "DELETE" and status < 300]
    assert f"/models/{folder}{older}" in deleted


def test_a_stale_probe_in_a_local_folder_goes_and_a_users_files_stay(tmp_path):
    folder = tmp_path / "exported"
    for name in USERS:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(f"user data {name}")
    fresh = f".kfp-finetune-probe-{int(time.time())}-00000000beef"  # another run's pre-flight, writing now
    stale = f".kfp-finetune-probe-{AN_HOUR_AGO}-00000000dead"  # a pre-flight killed an hour ago
    (folder / fresh).write_text("kfp-finetune pre-flight\n")
    (folder / stale).write_text("kfp-finetune pre-flight\n")
    assert run_preflight(export_destination=str(folder), **LOCAL) == ["export_destination"]
    left = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert left == {*USERS, fresh}
    assert all((folder / name).read_text() == f"user data {name}" for name in USERS)


@pytest.mark.parametrize("destination", ["local", "s3"])
def test_a_probe_name_is_unique_and_recognised_once_stale(tmp_path, s3, destination):
    """The probe the pre-flight writes is what the next one recognises: run one, catch the name it wrote."""
    if destination == "s3":
        run_preflight(export_destination="s3://models/names", s3_endpoint_url=s3.url, **LOCAL)
        names = [p.split("?")[0].rsplit("/", 1)[1] for m, p, _ in s3.requests if m == "PUT" and "probe" in p]
    else:
        seen = []
        folder = tmp_path / "names"
        folder.mkdir()
        real_open = type(folder).open

        def recording_open(path, *args, **kwargs):
            seen.append(path.name)
            return real_open(path, *args, **kwargs)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(type(folder), "open", recording_open)
            run_preflight(export_destination=str(folder), **LOCAL)
        names = [n for n in seen if n.startswith(".kfp-finetune-probe-")]
    (name,) = names
    assert not is_stale_probe(name, time.time())
    assert is_stale_probe(name, time.time() + PROBE_STALE_AFTER_SECONDS + 5)
