"""The persistent model cache (issue 16 item 5): content-addressed entries, hard-linked into each run's workspace,
used in place when the cache is on another volume. Local-file sources (the transfer itself is tested elsewhere)."""

from __future__ import annotations

import errno
import inspect
import os
import time
from pathlib import Path

from kfp_finetune.components._shared.artifacts import entry_path
from kfp_finetune.components._shared.storage.checksums import ledger_path
from kfp_finetune.components._shared.workspace import cache_lock_path, partial_path
from kfp_finetune.components.model_initialize import cache
from kfp_finetune.components.model_initialize.component import model_initialize
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


def days_ago(days: float) -> float:
    return time.time() - days * cache.DAY_SECONDS


def last_used_at(entry, when: float) -> None:
    """Set when a run last used `entry`, as a run that long ago would have left it: its lock file and the ledger
    of its last verification."""
    for path in (cache_lock_path(entry), ledger_path(entry)):
        if path.exists():
            os.utime(path, (when, when))


def two_sources(tmp_path):
    """Two models' sources, and a run of model-initialize on one of them into the cache (its own workspace)."""
    src = write_fake_model(tmp_path / "src", extra_bin=False)
    other_src = write_fake_model(tmp_path / "other", seed=1)

    def run(source, name, i):
        return initialize_model(
            str(source),
            str(tmp_path / f"ws{i}"),
            name=name,
            cache_path=str(tmp_path / "cache"),
            task_id=f"{i}",
        )

    return src, other_src, run


def test_entries_no_run_used_for_keep_days_are_removed_when_a_run_uses_the_cache(tmp_path, log_lines):
    """A schedule whose base model changed leaves the old version's entry; a killed fetch leaves a partial folder.
    The next run that uses the cache removes what no run used for keep_days, keeps the rest and what it uses, and
    a workspace of hard links to a removed entry keeps its files."""
    assert inspect.signature(model_initialize.python_func).parameters["cache_keep_days"].default == (
        cache.DEFAULT_KEEP_DAYS
    )
    src, other_src, run = two_sources(tmp_path)
    old = run(src, "m", 1)
    old_entry = Path(old.metadata["cache"]["entry"])
    other_entry = Path(run(other_src, "n", 2).metadata["cache"]["entry"])
    (src / "config.json").write_text('{"model_type": "llama", "architectures": ["Y"]}')  # a new version
    new_entry = Path(run(src, "m", 3).metadata["cache"]["entry"])
    # A fetch killed long ago: its lock file and partial folder.
    killed = cache.cache_entry(tmp_path / "cache", "m", "f" * 64)
    with cache.locked(killed):
        partial_path(killed).mkdir()
        (partial_path(killed) / "model.safetensors").write_bytes(b"\0" * 1000)
    last_used_at(old_entry, days_ago(31))
    last_used_at(killed, days_ago(40))
    last_used_at(other_entry, days_ago(29))
    last_used_at(new_entry, days_ago(45))  # the entry this run uses: never removed, and now marked used

    facts = run(src, "m", 4).metadata["cache"]
    assert facts["hit"] is True and facts["entry"] == str(new_entry)
    assert facts["evicted"] == sorted([old_entry.name, killed.name])
    assert not old_entry.exists() and not partial_path(killed).exists()
    assert new_entry.is_dir() and other_entry.is_dir()
    assert [p.name for p in old_entry.parent.glob(".*.old-*")] == []
    assert cache.last_used(new_entry) > days_ago(1)
    assert '"X"' in (old.path / "config.json").read_text()  # run 1's hard links outlive the entry
    (removed,) = [line for line in log_lines if "model cache: removed" in line]
    assert "2 entries no run used for 30 days" in removed and old_entry.name in removed

    # The removed version comes back as any new content does: fetched again, into the same name.
    (src / "config.json").write_text('{"model_type": "llama", "architectures": ["X"]}')
    again = run(src, "m", 5).metadata["cache"]
    assert again["hit"] is False and again["entry"] == str(old_entry) and again["evicted"] == []


def one_cached_model(tmp_path):
    """(its source, the cache, the fill's result, its entry, the entry of another run's model)."""
    src = write_fake_model(tmp_path / "src", extra_bin=False)
    cache_dir = str(tmp_path / "cache")
    res = initialize_model(str(src), str(tmp_path / "ws"), name="m", cache_path=cache_dir)
    entry = cache.cache_entry(cache_dir, "m", res.manifest["fingerprint"])
    return src, cache_dir, res, entry, cache.cache_entry(cache_dir, "other", "0" * 64)


def test_an_entry_a_run_holds_or_keep_days_minus_one_keeps_it(tmp_path):
    _, cache_dir, res, entry, current = one_cached_model(tmp_path)
    last_used_at(entry, days_ago(100))
    assert cache.evict_unused(cache_dir, -1, in_use=current) == []
    with cache.locked(entry):  # another run checking or filling it
        last_used_at(entry, days_ago(100))  # (taking the lock marked it used: as if it did so long ago)
        assert cache.evict_unused(cache_dir, 1, in_use=current) == []
    assert entry.is_dir()
    last_used_at(entry, days_ago(100))
    (evicted,) = cache.evict_unused(cache_dir, 1, in_use=current)
    assert evicted.name == entry.name and evicted.bytes > res.manifest["total_bytes"]  # + the manifest
    assert not entry.exists()


def test_what_marks_an_entry_used(tmp_path):
    """Taking the lock (a fill in progress is in use from its start, also where the filesystem shares no flocks
    between hosts), and a hit's verification ledger: entries hit by kfp-finetune versions that did not mark use
    are not removed as unused since their first fill."""
    src, cache_dir, _, entry, current = one_cached_model(tmp_path)

    last_used_at(entry, days_ago(100))
    with cache.locked(entry):
        assert cache.last_used(entry) > days_ago(1)

    last_used_at(entry, days_ago(100))
    # A second run hits the entry: the hit writes its checksum ledger.
    initialize_model(str(src), str(tmp_path / "ws2"), name="m", cache_path=cache_dir)
    last_used_at(entry, days_ago(100))
    os.utime(ledger_path(entry))  # an older version's hit: it rewrote the ledger, not the lock's mtime
    assert cache.evict_unused(cache_dir, 30, in_use=current) == [] and entry.is_dir()
    last_used_at(entry, days_ago(100))
    assert [e.name for e in cache.evict_unused(cache_dir, 30, in_use=current)] == [entry.name]


def test_an_entry_that_cannot_be_evicted_is_logged_and_the_run_goes_on(tmp_path, log_lines):
    """An error removing one entry (here its lock cannot be opened) never fails the run that uses the cache; the
    other unused entries go, and the step log names the one that stays."""
    src, other_src, run = two_sources(tmp_path)
    stuck = Path(run(src, "m", 1).metadata["cache"]["entry"])
    gone = Path(run(other_src, "n", 2).metadata["cache"]["entry"])
    cache_lock_path(stuck).unlink()
    cache_lock_path(
        stuck
    ).mkdir()  # open() fails with IsADirectoryError: an OSError, as a foreign lock's EACCES
    for entry in (stuck, gone):
        last_used_at(entry, days_ago(40))

    (src / "config.json").write_text('{"model_type": "llama", "architectures": ["Y"]}')
    facts = run(src, "m", 3).metadata["cache"]
    assert facts["evicted"] == [gone.name] and stuck.is_dir() and not gone.exists()
    (warning,) = [line for line in log_lines if "was not evicted" in line]
    assert stuck.name in warning
