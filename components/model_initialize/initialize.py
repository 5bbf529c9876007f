"""Bring a base model into the run workspace (`models/<name>/`): the files training needs, verified.

Sources: hf:// (huggingface_hub, pinned to the resolved commit), s3://, file:// / paths.
The copy is written to a stable partial folder (`models/.<name>.partial`) and renamed into place only once
complete and verified; a retried step keeps the files it already verified there. A rerun whose source content
is unchanged (same manifest fingerprint) and whose files are all present skips the transfer. With `cache_path`
the model is fetched into a persistent cache entry and linked into (or used in place of) the workspace entry
(cache.py).
"""

from __future__ import annotations

import fnmatch
import json
import struct
from dataclasses import dataclass
from pathlib import Path

from kfp_finetune.components._shared import storage
from kfp_finetune.components._shared.artifacts import (
    ArtifactLike,
    entry_name,
    remove_stale_temps,
    utc_now,
    workspace_relative,
    write_artifact,
)
from kfp_finetune.components._shared.contract import BaseModel
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.torchtune.model_inspection import (
    derive_missing_tokenizer_files,
    family_tokenizer_files,
)
from kfp_finetune.components._shared.workspace import (
    MANIFEST,
    area_dir,
    mark_cache_use,
    partial_dir,
    read_manifest,
    write_json_atomic,
)
from kfp_finetune.components.model_initialize import cache

log = get_logger(__name__)

# What training needs: weights, configs, tokenizer files (incl. Llama-3's original/tokenizer.model) and chat
# templates (transformers saves a tokenizer's or processor's template as chat_template.jinja).
DEFAULT_ALLOW_PATTERNS = ("*.safetensors", "*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja")
# Other weight formats, fetched only when a repo has no safetensors (torchtune reads PyTorch .bin too).
FALLBACK_WEIGHT_PATTERNS = ("*.bin", "*.pth", "*.pt")
# TensorFlow / Flax weights are never useful here.
NEVER_PATTERNS = ("*.h5", "*.msgpack", "*.ot", "*.onnx", "*.gguf")
REPO_ID_FILE = (
    "original_repo_id.json"  # read by torchtune's HF checkpointer (adapter base_model_name_or_path)
)

# Tokenizer files torchtune needs per config.json model_type (any one of the alternatives).
TOKENIZER_FILES: dict[str, tuple[tuple[str, ...], ...]] = {
    "llama": (("original/tokenizer.model",), ("tokenizer.model",)),
    "qwen2": (("vocab.json", "merges.txt"),),
    "qwen2_moe": (("vocab.json", "merges.txt"),),
    "qwen3": (("vocab.json", "merges.txt"),),
    "mistral": (("tokenizer.model",),),
    "gemma": (("tokenizer.model",),),
    "gemma2": (("tokenizer.model",),),
    "gemma3_text": (("tokenizer.model",),),
    "phi3": (("tokenizer.model",),),
}
TOKENIZER_JSON = ("tokenizer.json",)
ANY_TOKENIZER = (
    TOKENIZER_JSON,
    ("tokenizer.model",),
    ("vocab.json", "merges.txt"),
    ("tokenizer.tiktoken",),
)


class ModelVerificationError(RuntimeError):
    """The copied model is not usable for training; the message says what is missing or wrong."""


@dataclass
class ModelInitResult:
    path: Path
    manifest: dict
    metadata: dict
    skipped: bool


def select_files(paths: list[str], allow_patterns: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The files to fetch: `allow_patterns` (default: what training needs); other weight formats only when
    there are no safetensors; never TF/Flax weights."""
    patterns = tuple(allow_patterns) or DEFAULT_ALLOW_PATTERNS
    if not any(p.endswith(".safetensors") for p in paths):
        has_bin = any(p.endswith(".bin") for p in paths)
        patterns += ("*.bin",) if has_bin else FALLBACK_WEIGHT_PATTERNS
    chosen = [
        p
        for p in paths
        if any(fnmatch.fnmatch(p, pat) for pat in patterns)
        and not any(fnmatch.fnmatch(p, n) for n in NEVER_PATTERNS)
    ]
    return sorted(chosen)


def _check_safetensors(path: Path) -> None:
    """A safetensors file is complete when its header's last data offset matches the file size."""
    size = path.stat().st_size
    fix = "fetch or save the weights again"
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise ModelVerificationError(f"{path.name} is truncated ({size} bytes): {fix}")
        header_len = struct.unpack("<Q", raw)[0]
        if header_len > size - 8:
            raise ModelVerificationError(f"{path.name} has a corrupt header (bytes 0-7): {fix}")
        try:
            header = json.loads(f.read(header_len))
            data_end = max(
                (v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0
            )
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as err:
            raise ModelVerificationError(
                f"{path.name} has a corrupt header (bytes 8-{8 + header_len}: {err}): {fix}"
            ) from None
    if 8 + header_len + data_end != size:
        raise ModelVerificationError(
            f"{path.name} is {size} bytes, its header says {8 + header_len + data_end}: the file is truncated "
            f"or padded; {fix}"
        )


def verify_model_dir(model_dir: Path, source: str) -> dict:
    """Check config.json, the weights (single file or complete sharded index) and the family's tokenizer.

    Returns facts for the metadata: model_type, architectures, weight files and format.
    """

    def fail(why: str) -> ModelVerificationError:
        return ModelVerificationError(f"model from {source} is not usable: {why}")

    try:
        config = json.loads((model_dir / "config.json").read_text())
    except FileNotFoundError:
        raise fail("config.json is missing") from None
    except ValueError as exc:
        raise fail(f"config.json does not parse ({exc})") from exc
    model_type = config.get("model_type", "")

    indexes = sorted(model_dir.glob("*.index.json"))
    if indexes:
        weight_map = json.loads(indexes[0].read_text()).get("weight_map", {})
        weights = sorted(set(weight_map.values()))
        missing = [w for w in weights if not (model_dir / w).is_file()]
        if missing:
            raise fail(f"{indexes[0].name} lists shards that are missing: {', '.join(missing)}")
    else:
        weights = sorted(
            p.relative_to(model_dir).as_posix()
            for pattern in ("*.safetensors", "*.bin", "*.pth", "*.pt")
            for p in model_dir.glob(pattern)
        )
        if not weights:
            raise fail("no weights (*.safetensors, *.bin, *.pth)")
    for weight in weights:
        if weight.endswith(".safetensors"):
            try:
                _check_safetensors(model_dir / weight)
            except ModelVerificationError as exc:
                raise fail(str(exc)) from None

    alternatives = TOKENIZER_FILES.get(model_type, ANY_TOKENIZER)
    if (
        family_tokenizer_files(model_dir) == TOKENIZER_JSON
    ):  # SmolLM2, Mistral-Nemo: the families read it alone
        alternatives = (*alternatives, TOKENIZER_JSON)
    if not any(all((model_dir / name).is_file() for name in option) for option in alternatives):
        wanted = " or ".join("+".join(option) for option in alternatives)
        raise fail(
            f"no tokenizer for config.json's `model_type` {model_type or '(unset)'!r}: expected {wanted}"
        )
    weight_format = "safetensors" if weights[0].endswith(".safetensors") else Path(weights[0]).suffix[1:]
    return {
        "model_type": model_type,
        "architectures": config.get("architectures", []),
        "weight_files": weights,
        "weight_format": weight_format,
    }


def _present_copy_matches(final: Path, fingerprint: str, repo_id: str, max_workers: int) -> dict | None:
    """The manifest of a complete copy of this source content at `final` whose files still hold the bytes it
    records (hashed once per change of a file, storage.damaged_files); None when there is none or it is damaged."""
    manifest = read_manifest(final)
    if not manifest or manifest.get("fingerprint") != fingerprint or manifest.get("repo_id") != repo_id:
        return None
    damaged = storage.damaged_files(final, manifest.get("files", []), max_workers=max_workers)
    if damaged:
        log.warning(
            "%s: %s no longer hold the bytes its manifest records (changed in place): discarding the copy and "
            "fetching it again", final, ", ".join(damaged),
        )  # fmt: skip
        return None
    return manifest


def initialize_model(
    source_uri: str,
    workspace_path: str,
    name: str = "",
    allow_patterns: list[str] | tuple[str, ...] = (),
    base_model_id: str = "",
    s3_endpoint_url: str = "",
    max_workers: int = 8,
    cache_path: str = "",
    output_model: ArtifactLike | None = None,
    task_id: str = "",
    cache_keep_days: int = cache.DEFAULT_KEEP_DAYS,
) -> ModelInitResult:
    """Fetch the model at `source_uri` into `<workspace_path>/models/<name>-<task>/` (`<task>`: a hash of `task_id`,
    see names.instance_name) and describe it in `output_model`."""
    parsed = storage.parse_uri(source_uri)
    if cache_path:
        cache.check_cache_path(cache_path)
        cache.check_keep_days(cache_keep_days)
    # The cache is shared by runs: its entries are named by the source alone (and its content), never the task.
    readable = entry_name(name, parsed.repo_id or parsed.raw)
    name = entry_name(name, parsed.repo_id or parsed.raw, task_id)
    final = area_dir(workspace_path, "models", name)
    listing = storage.list_files(parsed, repo_type="model", endpoint_url=s3_endpoint_url or None)
    source_uri = parsed.shown  # from here on the URI is only shown and recorded: never with its credentials
    paths = select_files([f.path for f in listing.files], allow_patterns)
    if not paths:
        raise storage.StorageError(
            f"{source_uri}: no files match {list(allow_patterns) or list(DEFAULT_ALLOW_PATTERNS)}; "
            f"the source holds: {', '.join(f.path for f in listing.files[:20])}"
        )
    fingerprint = listing.fingerprint(paths)
    where = f"{source_uri}" + (f" (commit {listing.commit_sha})" if listing.commit_sha else "")
    repo_id = base_model_id or listing.uri.repo_id or source_uri

    fetch = dict(listing=listing, paths=paths, name=name, repo_id=repo_id, fingerprint=fingerprint)
    cache_facts: dict = {}
    location = final
    if cache_path:
        entry = cache.cache_entry(cache_path, readable, fingerprint)
        with cache.locked(entry):
            manifest = _present_copy_matches(entry, fingerprint, repo_id, max_workers)
            hit = manifest is not None
            if hit:
                log.info("model cache hit: %s holds %s (verified); fetching nothing", entry, where)
            else:
                log.info("model cache miss: fetching %s into %s", where, entry)
                manifest = _fetch(entry, max_workers=max_workers, **fetch)
            cache.make_read_only(entry)
            how = (
                "already present"
                if cache.links_to(final, entry)
                else cache.link_or_use_in_place(entry, final)
            )
            mark_cache_use(entry)  # again at the end: a long fill counts from when it ended
        location = entry if how == "in place" else final
        evicted = cache.evict_unused(cache_path, cache_keep_days, in_use=entry)
        if evicted:
            log.info(
                "model cache: removed %d entr%s no run used for %d days (%.1f GB): %s",
                len(evicted), "y" if len(evicted) == 1 else "ies", cache_keep_days,
                sum(e.bytes for e in evicted) / 1e9, ", ".join(e.name for e in evicted),
            )  # fmt: skip
        cache_facts = {
            "hit": hit,
            "entry": str(entry),
            "bytes_fetched": 0 if hit else manifest["total_bytes"],
            "bytes_copied": 0,
            "workspace_copy": how,
            "evicted": [e.name for e in evicted],
        }
        skipped = hit
    else:
        manifest = _present_copy_matches(final, fingerprint, repo_id, max_workers)
        skipped = manifest is not None
        if skipped:
            log.info(
                "models/%s already holds %s with a matching manifest: skipping the transfer", name, where
            )
        else:
            remove_stale_temps(final)
            log.info(
                "fetching %d of %d files from %s into models/%s", len(paths), len(listing.files), where, name
            )
            manifest = _fetch(final, max_workers=max_workers, **fetch)

    metadata = BaseModel(
        # Relative to the workspace; absolute when the model is used in place on a cache volume
        # (artifacts.entry_path resolves both).
        workspace_path=(workspace_relative(final, workspace_path) if location == final else str(location)),
        source_uri=manifest["source_uri"],
        repo_id=manifest["repo_id"],
        revision=manifest["revision"] or "",
        commit_sha=manifest["commit_sha"] or "",
        model_type=manifest["model_type"],
        weight_format=manifest["weight_format"],
        num_files=len(manifest["files"]),
        total_bytes=manifest["total_bytes"],
        files=manifest["files"],
        reused_existing_copy=skipped,
        cache=cache_facts or None,
    ).to_metadata()
    write_artifact(output_model, manifest, metadata)
    return ModelInitResult(location, manifest, metadata, skipped)


def _fetch(
    final: Path,
    *,
    listing: storage.Listing,
    paths: list[str],
    name: str,
    repo_id: str,
    fingerprint: str,
    max_workers: int,
) -> dict:
    """Fetch `paths` into `final` through its stable partial folder, verify the model and write its manifest."""
    source_uri = listing.uri.shown
    # A model that fails verification is unusable at its source: nothing in its partial folder is worth keeping.
    with partial_dir(final, discard_on=(ModelVerificationError,)) as tmp:
        records = storage.download(listing, paths, tmp, max_workers=max_workers)
        derived = derive_missing_tokenizer_files(tmp)
        if derived:
            log.info(
                "wrote %s from the model's tokenizer.json (torchtune reads only these)", " + ".join(derived)
            )
        facts = verify_model_dir(tmp, source_uri)
        write_json_atomic(tmp / REPO_ID_FILE, {"repo_id": repo_id})
        manifest = {
            "kind": "model",
            "name": name,
            "source_uri": source_uri,
            "repo_id": repo_id,
            "revision": listing.revision,
            "commit_sha": listing.commit_sha,
            "fingerprint": fingerprint,
            "files": [r.as_dict() for r in records],
            "total_bytes": sum(r.size for r in records),
            "created_at": utc_now(),
            **facts,
        }
        write_json_atomic(tmp / MANIFEST, manifest)
    log.info("%s is complete: %d files, %d bytes", final.name, len(records), manifest["total_bytes"])
    return manifest
