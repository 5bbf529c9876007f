"""Credentials never echoed: one redaction (components/_shared/redact.py) for every URL inside any text, applied to
every log record of the process, every uncaught traceback, every usage error and StorageError message; and each
echo path issue 24 found, against the real client and a real server or the hub stand-in:

- the signed CDN URL of a hub LFS file in the retry warnings and the final error (formatted from the client's
  exception);
- an S3 endpoint with userinfo in botocore's connection error and in our own `_where`;
- a query after `hf://…@revision` in "revision … not found".

And Xet: production switches it off itself, so the hub stand-in (no Xet) tests the path production runs."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from kfp_finetune.components._shared import storage
from kfp_finetune.components._shared.errors import usage_errors
from kfp_finetune.components._shared.logs import get_logger
from tests.support.hub_standin import HubStandin
from tests.support.sources import (
    ROOT,
    hub_env,
    moto_s3,
    result,
    run_python,
    use_s3_credentials,
    write_fake_model,
)

SECRET = "plantedSECRET0123456789"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (
            f"HTTP Error 500 thrown while requesting GET https://cdn-lfs.hf.co/repos/ab/cd/ef?response-content-"
            f"disposition=x&Expires=1767225600&Policy={SECRET}&Signature={SECRET}&Key-Pair-Id=K3RPWS32NSSJCE",
            "HTTP Error 500 thrown while requesting GET https://cdn-lfs.hf.co/repos/ab/cd/ef?<redacted>",
        ),
        (
            f"'https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIA&X-Amz-Signature={SECRET}' expired",
            "'https://b.s3.amazonaws.com/k?<redacted>' expired",
        ),
        (
            f'Could not connect to the endpoint URL: "http://AKIA:{SECRET}@minio:9000/bucket?list-type=2"',
            'Could not connect to the endpoint URL: "http://<redacted>@minio:9000/bucket?<redacted>"',
        ),
        # The hub client's size check shows the last 40 characters of the URL it read, without the scheme.
        (
            f"should be of size 9 but has size 4 ((…)ors?Expires=4102444800&Signature={SECRET}).",
            "should be of size 9 but has size 4 ((…)ors?Expires=<redacted>&Signature=<redacted>).",
        ),
        (
            "s3://bucket/models/v1 (endpoint http://minio:9000)",
            "s3://bucket/models/v1 (endpoint http://minio:9000)",
        ),
        ("hf://org/repo@main: lr=1e-4 step=3", "hf://org/repo@main: lr=1e-4 step=3"),
    ],
)
def test_redact_text_takes_every_credential_out_of_urls_in_a_text_and_leaves_the_rest(text, shown):
    assert storage.redact_text(text) == shown


def test_every_log_record_of_the_process_is_redacted_ours_and_a_librarys(log_lines, caplog):
    """The hub client logs its own retry warnings with the signed URL, through its own logger."""
    signed = f"https://cdn.example/x.safetensors?Expires=1&Signature={SECRET}"
    get_logger(__name__).warning("transient error (%s); retry", signed)
    with caplog.at_level(logging.WARNING, logger="huggingface_hub.utils._http"):
        logging.getLogger("huggingface_hub.utils._http").warning(
            f"HTTP Error 500 while requesting GET {signed}"
        )
    assert log_lines == ["transient error (https://cdn.example/x.safetensors?<redacted>); retry"]
    assert [r.getMessage() for r in caplog.records if r.name.startswith("huggingface_hub")] == [
        "HTTP Error 500 while requesting GET https://cdn.example/x.safetensors?<redacted>"
    ]


def test_an_uncaught_traceback_and_a_usage_error_show_urls_redacted(capsys):
    crash = (
        "from kfp_finetune.components._shared.logs import get_logger\n"
        "get_logger('step')\n"
        f"raise RuntimeError('GET https://cdn.example/x?Signature={SECRET} failed')\n"
    )
    proc = subprocess.run([sys.executable, "-c", crash], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 1 and "Traceback" in proc.stderr, proc.stderr
    assert (
        "RuntimeError: GET https://cdn.example/x?<redacted> failed" in proc.stderr
        and SECRET not in proc.stderr
    )

    with pytest.raises(SystemExit), usage_errors(RuntimeError):
        raise RuntimeError(f"cannot read https://h/x.jsonl?X-Amz-Signature={SECRET}")
    assert capsys.readouterr().err == "error: cannot read https://h/x.jsonl?<redacted>\n"


def test_a_storage_error_formatted_from_a_client_error_is_redacted():
    client_error = f"500 Server Error for url: http://localhost:1/cdn-lfs/x?Expires=1&Signature={SECRET}"
    assert str(storage.StorageError(f"download of hf://org/m failed: {client_error}")) == (
        "download of hf://org/m failed: 500 Server Error for url: http://localhost:1/cdn-lfs/x?<redacted>"
    )


# --- an S3 endpoint with userinfo: botocore's connection error and our own `_where` ---------------------------


@pytest.fixture
def s3(monkeypatch):
    use_s3_credentials(monkeypatch)
    monkeypatch.setenv("KFP_FINETUNE_RETRIES", "1")
    with moto_s3() as endpoint:
        yield endpoint


@pytest.mark.slow
def test_an_s3_endpoint_with_userinfo_is_never_shown_with_it(s3, log_lines):
    host = s3.split("://", 1)[1]
    with pytest.raises(storage.StorageError, match="bucket 'no-bucket' does not exist") as missing:
        storage.list_files("s3://no-bucket/models", endpoint_url=f"http://AKIAPLANTED:{SECRET}@{host}")
    assert f"(endpoint http://<redacted>@{host})" in str(missing.value)  # our own `_where`

    closed = "127.0.0.1:9"  # nothing listens on the discard port
    with pytest.raises(storage.StorageError, match="cannot reach the S3 endpoint") as unreachable:
        storage.list_files("s3://bucket/models", endpoint_url=f"http://AKIAPLANTED:{SECRET}@{closed}")
    message = str(unreachable.value)
    assert f'endpoint URL: "http://<redacted>@{closed}/bucket?<redacted>"' in message  # botocore's own text
    assert "\n" not in message and "s3_endpoint_url" in message
    assert not [text for text in [str(missing.value), message, *log_lines] if SECRET in text]


# --- the hub: a signed CDN URL in retries and the final error; a query after @revision --------------------------

HUB_ECHOES = """
    import json, sys
    from kfp_finetune.components._shared import storage

    def attempt(uri, dest):
        try:
            storage.download(storage.list_files(uri), ["model.safetensors"], dest)
            return "downloaded"
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    print(json.dumps({"cdn": attempt(sys.argv[1], sys.argv[3] + "/cdn"),
                      "revision": attempt(sys.argv[2], sys.argv[3] + "/revision")}))
"""
# What the stand-in's CDN redirect signs an LFS URL with (tests/support/hub_standin.py), and the planted token.
SIGNED = ("Expires=4102444800", "Signature=standin", SECRET)


@pytest.fixture(scope="module")
def hub_echoes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hub-echoes")
    with HubStandin() as hub:
        hub.add_repo("org/tiny", write_fake_model(tmp / "src"))
        hub.fail_once(
            "model.safetensors", "500", times=100
        )  # the CDN answers 500 to every GET of the LFS file
        env = {**hub_env(hub.endpoint, tmp), "KFP_FINETUNE_RETRIES": "2"}
        proc = run_python(
            HUB_ECHOES, env, "hf://org/tiny", f"hf://org/tiny@v9?token={SECRET}", str(tmp / "out")
        )
    return result(proc), proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_signed_cdn_url_is_redacted_in_the_retry_warnings_and_the_final_error(hub_echoes):
    outcome, output = hub_echoes
    assert outcome["cdn"].startswith("StorageError: download of hf://org/tiny failed: "), outcome
    assert "500 Internal Server Error" in outcome["cdn"]
    assert "/cdn-lfs/" in outcome["cdn"] and "?<redacted>" in outcome["cdn"]  # the URL is named, unsigned
    assert "retry 1/1" in output and "/cdn-lfs/" in output  # the warning was logged, with the URL
    assert not [s for s in SIGNED if s in output], output[-3000:]


def test_a_query_after_a_revision_is_refused_and_never_echoed(hub_echoes):
    outcome, output = hub_echoes
    assert outcome["revision"].startswith("ValueError: invalid storage URI 'hf://org/tiny@v9?<redacted>'")
    assert "HF_TOKEN" in outcome["revision"]
    assert SECRET not in output


# --- Xet: off in production, as in the tests ---------------------------------------------------------------------

XET = """
    import json
    import huggingface_hub  # first, as `datasets` imports it before any of our code runs
    from huggingface_hub.utils._runtime import is_xet_available
    import hf_xet  # installed: the hub client would upload through Xet
    before = is_xet_available()
    import kfp_finetune.components._shared.storage
    print(json.dumps({"before": before, "after": is_xet_available()}))
"""


def test_xet_is_switched_off_by_our_code_even_when_the_hub_client_was_imported_first(tmp_path):
    env = hub_env("http://127.0.0.1:9", tmp_path)
    assert "HF_HUB_DISABLE_XET" not in env  # the tests rely on production's switch, as production does
    assert result(run_python(XET, env)) == {"before": True, "after": False}


def test_a_url_inside_json_is_redacted_and_the_json_stays_valid():
    """`redact_text` stops a URL at a quote, so a URL inside JSON (metadata, manifests) is redacted alone."""
    text = json.dumps({"source_uri": f"https://h/x.jsonl?sig={SECRET}", "rows": 3})
    assert json.loads(storage.redact_text(text)) == {"source_uri": "https://h/x.jsonl?<redacted>", "rows": 3}


def test_a_retry_warning_is_redacted_before_it_is_cut_to_its_first_200_characters(log_lines, monkeypatch):
    monkeypatch.setenv("KFP_FINETUNE_RETRY_DELAY", "0")
    attempts = []

    def flaky():
        attempts.append(1)
        if len(attempts) == 1:  # the 200th character falls inside the userinfo
            raise ConnectionError("x" * 180 + f" http://AKIAPLANTED:{SECRET}@minio:9000/bucket")
        return "ok"

    assert storage.with_retries(flaky, what="list s3://bucket", attempts=2) == "ok"
    assert len(log_lines) == 1 and "http://<redacted>@m" in log_lines[0], log_lines
    assert SECRET[:6] not in log_lines[0]
