"""The hub stand-in behaves as the hub does for what our steps rely on (gating, LFS redirects, paginated trees),
shown with the real `huggingface_hub` client (in a child process: the test session runs offline)."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from tests.support.hub_standin import HubStandin
from tests.support.sources import hub_env, result, run_python

WEIGHTS = b"\x00" * 20_000  # LFS by size and suffix

CLIENT = """
import json, os, sys
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import HfHubHTTPError

action, repo, arg = sys.argv[1:4]
token = arg if arg != "-" else False
out = {}
try:
    if action == "info":
        info = HfApi(token=token).model_info(repo, files_metadata=True)
        out = {"gated": info.gated, "files": sorted(s.rfilename for s in info.siblings)}
    elif action == "download":
        path = hf_hub_download(repo, sys.argv[4], token=token)
        out = {"bytes": len(open(path, "rb").read())}
    elif action == "tree":
        out = {"paths": sorted(e.path for e in HfApi(token=token).list_repo_tree(repo, recursive=True))}
except HfHubHTTPError as exc:
    out = {"error": type(exc).__name__, "status": exc.response.status_code}
print(json.dumps(out))
"""


@pytest.fixture
def repo_dir(tmp_path):
    folder = tmp_path / "repo"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text('{"a": 1}')
    (folder / "model.safetensors").write_bytes(WEIGHTS)
    for i in range(3):
        (folder / "sub" / f"part-{i}.txt").write_text(f"part {i}")
    return folder


def client(hub: HubStandin, tmp_path, *args: str) -> dict:
    return result(run_python(CLIENT, hub_env(hub.endpoint, tmp_path), *args))


@pytest.mark.slow
def test_a_gated_repo_is_listed_but_its_files_need_an_accepted_token(repo_dir, tmp_path):
    with HubStandin() as hub:
        hub.add_repo("org/gated", repo_dir, gated=True, tokens=("accepted",))
        info = client(hub, tmp_path, "info", "org/gated", "-")
        assert info["gated"] == "manual" and "config.json" in info["files"]
        anonymous = client(hub, tmp_path, "download", "org/gated", "-", "config.json")
        refused = client(hub, tmp_path, "download", "org/gated", "someone-else", "config.json")
        accepted = client(hub, tmp_path, "download", "org/gated", "accepted", "config.json")
    assert anonymous == {"error": "GatedRepoError", "status": 401}
    assert refused == {"error": "GatedRepoError", "status": 403}
    assert accepted == {"bytes": len('{"a": 1}')}


@pytest.mark.slow
def test_lfs_files_come_through_a_redirect_to_a_cdn_that_refuses_the_token(repo_dir, tmp_path):
    with HubStandin() as hub:
        hub.add_repo("org/private", repo_dir, private=True, tokens=("owner",))
        out = client(hub, tmp_path, "download", "org/private", "owner", "model.safetensors")
        resolve = [s for m, p, s in hub.requests if "/resolve/" in p and p.endswith("/model.safetensors")]
        cdn = [(m, p, s) for m, p, s in hub.requests if p.startswith("/cdn-lfs/")]
        location = f"http://localhost:{hub.endpoint.rsplit(':', 1)[1]}{cdn[-1][1]}"
        request = urllib.request.Request(location, headers={"Authorization": "Bearer owner"})
        with pytest.raises(urllib.error.HTTPError) as forwarded:  # a client that forwards the token fails
            urllib.request.urlopen(request)
    assert out == {"bytes": len(WEIGHTS)}
    assert resolve and set(resolve) == {302}  # the hub itself never serves LFS bytes
    assert [s for m, _, s in cdn if m == "GET"] == [200]  # fetched from the CDN, without the token
    assert forwarded.value.code == 400


def test_tree_listings_are_paginated_with_a_link_header(repo_dir, tmp_path):
    with HubStandin() as hub:
        hub.tree_page_size = 2
        hub.add_repo("org/many", repo_dir)
        out = client(hub, tmp_path, "tree", "org/many", "-")
        pages = [p for m, p, _ in hub.requests if m == "GET" and "/tree/" in p]
    assert out["paths"] == [
        "config.json", "model.safetensors", "sub", "sub/part-0.txt", "sub/part-1.txt", "sub/part-2.txt"
    ]  # fmt: skip
    assert len(pages) == 3 and all("cursor=" in p for p in pages[1:])
