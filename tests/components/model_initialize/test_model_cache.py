"""The persistent model cache (issue 16 item 5): content-addressed entries, hard-linked into each run's workspace,
used in place when the cache is on another volume. Local-file sources (the transfer itself is tested elsewhere)."""

from __future__ import annotations

import errno
import os

from kfp_finetune.components._shared.artifacts import entry_path
from kfp_finetune.components.model_initialize import cache
from kfp_finetune.components.model_initialize.initialize import initialize_model
from kfp_finetune.components.torchtune_finetune.finetune import workspace_entry
from tests.support.sources import write_fake_model


def test_second_run_fetches_nothing_and_links_the_cache_entry(tmp_path):
    src = write_fake_model(tmp_path / "src", extra_bin=False)
    cache_dir = tmp_path / "cache"
    # Two scheduled runs: two KFP task ids, so two workspace entry names, and one cache entry.
    first = initialize_model(
        str(src), str(tmp_path / "ws1"), name="m", cache_path=str(cache_dir), task_id="run-1"
    )
    second = initialize_model(
        str(src), str(tmp_path / "ws2"), name="m", cache_path=str(cache_dir), task_id="run-2"
    )
    assert first.metadata["cache"]["hit"] is False and first.metadata["cache"]["bytes_fetched"] > 0
    facts = second.metadata["cache"]
    assert facts["hit"] is True and facts["bytes_fetched"] == 0 and facts["bytes_copied"] == 0
    assert (
        facts["workspace_copy"] == "hardlink"
        and second.metadata["workspace_path"] == f"models/{second.path.name}"
    )
    entry = cache_dir / "models" / f"m-{second.manifest['fingerprint'][:12]}"
    assert facts["entry"] == str(entry)
    assert second.path.name.startswith("m-") and second.path.name != first.path.name
    weights = second.path / "model.safetensors"
    assert os.lstat(weights).st_ino == os.lstat(entry / "model.safetensors").st_ino  # a hard link

    # A changed source is a new entry; the old one (another run may train from it) stays intact.
    (src / "config.json").write_text('{"model_type": "llama", "architectures": ["Y"]}')
    third = initialize_model(str(src), str(tmp_path / "ws3"), name="m", cache_path=str(cache_dir))
    assert third.metadata["cache"]["hit"] is False and third.metadata["cache"]["entry"] != str(entry)
    assert '"X"' in (entry / "config.json").read_text()
    assert len(list((cache_dir / "models").glob("m-*"))) == 2


def test_cache_on_another_volume_is_used_in_place(tmp_path, monkeypatch):
    """EXDEV simulated: the one link helper fails as os.link does across filesystems (no second filesystem here)."""

    def cross_device(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link", str(src))

    monkeypatch.setattr(cache, "link_file", cross_device)
    src = write_fake_model(tmp_path / "src", extra_bin=False)
    res = initialize_model(str(src), str(tmp_path / "ws"), name="m", cache_path=str(tmp_path / "cache"))
    assert res.metadata["cache"]["workspace_copy"] == "in place"
    assert os.path.isabs(res.metadata["workspace_path"])
    assert (tmp_path / "ws" / res.metadata["workspace_path"] / "config.json").is_file()  # resolves as before
    # What the fine-tune and evaluate steps read it through.
    assert entry_path(tmp_path / "ws", res.metadata["workspace_path"]) == res.path
    assert workspace_entry(tmp_path / "ws", res.metadata, "base_model") == res.path
    assert not (tmp_path / "ws" / "models" / "m").exists()


def test_a_second_run_waits_for_the_first_and_then_fetches_nothing(tmp_path, monkeypatch):
    """Two initializations of one model into one cache at once (this process and a child process): the second
    waits on the entry's lock while the first fetches, fetches nothing itself, and then finds the entry complete.
    Synchronised by events and the child's log lines, never by sleeping."""
    import json
    import queue
    import subprocess
    import sys
    import threading
    from pathlib import Path

    from kfp_finetune.components.model_initialize import initialize

    src = write_fake_model(tmp_path / "src", extra_bin=False)
    cache_dir = tmp_path / "cache"
    fetching, release = threading.Event(), threading.Event()
    real_fetch = initialize._fetch

    def held_fetch(final, **kwargs):  # the first run, paused with the lock held and the fetch under way
        fetching.set()
        assert release.wait(300)
        return real_fetch(final, **kwargs)

    monkeypatch.setattr(initialize, "_fetch", held_fetch)
    results: dict = {}
    first = threading.Thread(
        target=lambda: results.update(
            first=initialize_model(str(src), str(tmp_path / "ws1"), name="m", cache_path=str(cache_dir))
        )
    )
    first.start()
    try:
        assert fetching.wait(300)
        script = (
            "import json, sys\n"
            "from kfp_finetune.components.model_initialize.initialize import initialize_model\n"
            f"r = initialize_model({str(src)!r}, {str(tmp_path / 'ws2')!r}, name='m', cache_path={str(cache_dir)!r})\n"
            "print(json.dumps(r.metadata['cache']))\n"
        )
        root = Path(__file__).resolve().parents[3]
        child = subprocess.Popen(
            [sys.executable, "-c", script],
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines: queue.Queue = queue.Queue()
        threading.Thread(
            target=lambda: [lines.put(line) for line in child.stderr] + [lines.put(None)]
        ).start()
        seen = []
        while not any("waiting for it" in line for line in seen):
            line = lines.get(timeout=300)  # a guard against a hang only
            assert line is not None, "the second run ended without waiting:\n" + "".join(seen)
            seen.append(line)
        assert not any("fetching" in line and "waiting" not in line for line in seen), seen
        entries = list((cache_dir / "models").glob("m-*"))
        assert entries == []  # only the first run's partial folder and lock so far
    finally:
        release.set()
        first.join()
    out = child.stdout.read()
    assert child.wait() == 0
    facts = json.loads(out.strip().splitlines()[-1])
    assert results["first"].metadata["cache"]["hit"] is False
    assert facts["hit"] is True and facts["bytes_fetched"] == 0 and facts["bytes_copied"] == 0
    assert facts["entry"] == results["first"].metadata["cache"]["entry"]
