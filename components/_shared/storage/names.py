"""Remote names are untrusted: refused when they could escape the destination, and every fetched file is
written through `write_target`, which proves its target is inside the destination.

A bucket may hold the key `prefix/../../x` (S3 allows it) and a listing may name anything; joined naively
(`dest / rel`) such a name writes outside the run's workspace.

The one name the storage itself writes at a destination it does not own is pre-flight's probe (probe.py):
`.kfp-finetune-probe-<unix time>-<12 hex digits>`, unique, and telling its age by itself, so the next pre-flight can
remove the probes a killed one left behind (`is_stale_probe`) and nothing else.
"""

from __future__ import annotations

import re
import unicodedata
import uuid
from pathlib import Path

from .errors import HostileName


def _why_hostile(name: str) -> str | None:
    if not name:
        return "it is empty"
    if "\\" in name:
        return "it contains a backslash"
    if any(unicodedata.category(ch) == "Cc" for ch in name):  # NUL, newlines, escapes, DEL
        return "it contains a NUL or control character"
    if name.startswith("/"):
        return "it is absolute"
    segments = name.split("/")
    if ".." in segments:
        return "it has a '..' segment"
    if "" in segments or "." in segments:
        return "it has an empty or '.' segment"
    return None


def check_remote_name(name: str, *, key: str, source: str) -> str:
    """Return `name` (a path relative to the destination) or raise HostileName naming `key` and `source`."""
    why = _why_hostile(name)
    if why:
        raise HostileName(
            f"refusing the remote name {key!r} from {source}: {why}. Nothing was written; rename or remove "
            "that object at the source."
        )
    return name


def write_target(dest: Path, name: str, *, key: str, source: str) -> Path:
    """The path to write remote file `name` to: checked, proven inside `dest`, its parent folders created."""
    check_remote_name(name, key=key, source=source)
    root = Path(dest).resolve()
    target = (root / name).resolve()
    try:
        target.relative_to(root)
    except ValueError:  # a symlinked folder inside dest pointing elsewhere
        raise HostileName(
            f"refusing the remote name {key!r} from {source}: it resolves outside the destination."
        ) from None
    if target == root:
        raise HostileName(f"refusing the remote name {key!r} from {source}: it names the destination itself.")
    target.parent.mkdir(parents=True, exist_ok=True)
    return target


PROBE_PREFIX = ".kfp-finetune-probe-"
_PROBE_NAME = re.compile(r"\.kfp-finetune-probe-(\d{10})-[0-9a-f]{12}")
# A probe lives for a put and a delete (seconds, a minute with retries); one older than this was left by a
# pre-flight that was killed, and another run's pre-flight writing now is never this old.
PROBE_STALE_AFTER_SECONDS = 15 * 60


def probe_name(now: float) -> str:
    """A new probe's name (a file or an object directly in the destination folder), made at `now` (Unix time)."""
    return f"{PROBE_PREFIX}{int(now):010d}-{uuid.uuid4().hex[:12]}"


def is_stale_probe(name: str, now: float) -> bool:
    """`name` is exactly a probe's name (never a user's file that merely starts alike) made longer ago than
    PROBE_STALE_AFTER_SECONDS before `now`."""
    match = _PROBE_NAME.fullmatch(name)
    return bool(match) and now - int(match[1]) > PROBE_STALE_AFTER_SECONDS
