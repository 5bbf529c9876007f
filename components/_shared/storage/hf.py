"""hf:// — Hugging Face Hub model and dataset repos (huggingface_hub; HF_TOKEN and HF_ENDPOINT from the env).

Transfers use the hub's HTTP and git-LFS protocol, never Xet: huggingface_hub >= 1 uploads every file through Xet
whenever `hf_xet` is installed (it comes with it), a path no test here can run (Xet's CAS has no stand-in), so this
module switches Xet off for the whole process (`HF_HUB_DISABLE_XET`) before anything uses the hub client, and the
tests run that same path. The hub keeps serving and accepting Xet-backed repos over plain HTTP / LFS.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.workspace import SCRATCH_PREFIX

from .checksums import verify
from .errors import IntegrityError, StorageError
from .listing import FileRecord, Listing, RemoteFile
from .names import write_target
from .parallel import run_parallel
from .progress import Progress, human
from .retry import status_code, with_retries
from .uri import StorageUri

log = get_logger(__name__)

COUNTS_FILES_ON_DISK = True  # the hub client gives no per-file callback
WRITABLE = True
ATOMIC_CHANGES = True  # one commit per put: atomic
OWNS_DESTINATION = True  # the repo is ours: overwrite may remove any file in it; its root is fine
_REPO_FILES = {".gitattributes"}  # the hub creates it with every repo: not a conflict, never deleted


def _without_xet() -> None:
    """Xet off for this process and its children: huggingface_hub reads HF_HUB_DISABLE_XET at import and then
    looks at `constants.HF_HUB_DISABLE_XET` before each transfer, so a client imported earlier (by `datasets`)
    is switched off too."""
    os.environ["HF_HUB_DISABLE_XET"] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_DISABLE_XET = True


_without_xet()  # on import: storage is imported before any transfer (and any use of `datasets`) in a step


def _token() -> str | bool:
    # Env only; False (not None) so huggingface_hub does not fall back to a token stored on disk.
    return os.environ.get("HF_TOKEN") or False


def _endpoint() -> str | None:
    # Read at call time: huggingface_hub reads HF_ENDPOINT once at import.
    return os.environ.get("HF_ENDPOINT") or None


def _api():
    from huggingface_hub import HfApi

    return HfApi(endpoint=_endpoint(), token=_token())


def error(exc: BaseException, uri: StorageUri, repo_type: str = "model") -> StorageError | None:
    """Turn a hub client error into a message that names the repo and says what to do."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo = f"{repo_type} repo {uri.repo_id!r} ({uri.shown})"
    has_token = bool(os.environ.get("HF_TOKEN"))
    code = status_code(exc)
    if isinstance(exc, GatedRepoError):
        if has_token:
            return StorageError(
                f"{repo} is gated and the token in HF_TOKEN has no access ({code}): accept the model's terms "
                "on the hub with the token's account, or use a token that has access."
            )
        return StorageError(
            f"{repo} is gated ({code}) and HF_TOKEN is not set: set HF_TOKEN (from a Kubernetes Secret) to a "
            "token whose account accepted the model's terms."
        )
    if isinstance(exc, RevisionNotFoundError):
        return StorageError(
            f"revision {uri.revision!r} not found in {repo}: use a branch, tag or commit sha."
        )
    # A missing remote file (hub 1.x: RemoteEntryNotFoundError, 0.x: EntryNotFoundError) is an HTTP error; a
    # missing cached file (LocalEntryNotFoundError) is not.
    if isinstance(exc, EntryNotFoundError) and isinstance(exc, HfHubHTTPError):
        return StorageError(f"a file is missing in {repo}: {exc}".splitlines()[0])
    if isinstance(exc, RepositoryNotFoundError):
        hint = "check the name, and the token's access" if has_token else "if it is private, set HF_TOKEN"
        return StorageError(f"{repo} not found or not accessible ({code}): {hint}.")
    if isinstance(exc, HfHubHTTPError) and code in (401, 403):
        return StorageError(f"access to {repo} denied ({code}): check HF_TOKEN.")
    return None


def _remote_file(rel: str, sibling) -> RemoteFile:
    lfs = sibling.lfs
    return RemoteFile(
        rel,
        lfs.size if lfs else sibling.size,
        sibling.rfilename,
        sha256=lfs.sha256 if lfs else None,
        git_blob_sha1=None if lfs else sibling.blob_id,
    )


def list_files(uri: StorageUri, *, repo_type: str, endpoint_url: str | None) -> Listing:
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    repo_type = uri.repo_type or repo_type
    api = _api()
    try:
        info = with_retries(
            lambda: api.repo_info(
                uri.repo_id, repo_type=repo_type, revision=uri.revision, files_metadata=True
            ),
            what=f"list hf {repo_type} {uri.repo_id}",
        )
    except HfHubHTTPError as exc:
        raise (error(exc, uri, repo_type) or exc) from exc
    except OfflineModeIsEnabled as exc:
        raise StorageError(
            f"cannot read {uri.shown}: HF_HUB_OFFLINE is set in the step's environment."
        ) from exc
    prefix = uri.path.strip("/")
    files = []
    for sibling in info.siblings or []:
        name = sibling.rfilename
        if prefix and not (name == prefix or name.startswith(prefix + "/")):
            continue
        rel = name[len(prefix) + 1 :] if prefix and name != prefix else name
        files.append(_remote_file(PurePosixPath(name).name if name == prefix else rel, sibling))
    if not files:
        where = f"under {prefix!r} in " if prefix else "in "
        raise StorageError(f"no files {where}{repo_type} repo {uri.repo_id!r} ({uri.shown}).")
    if info.gated:
        _require_file_access(uri, repo_type, info.sha, files[0].source_path)
    return Listing(uri, files, revision=uri.revision or "main", commit_sha=info.sha, repo_type=repo_type)


def _require_file_access(uri: StorageUri, repo_type: str, commit: str, remote_name: str) -> None:
    """A gated repo's info and listing are public, its files are not (the hub answers 401/403 on /resolve/):
    read one file's metadata, as a download starts, so a missing or refused token fails before anything is
    fetched."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError

    url = hf_hub_url(uri.repo_id, remote_name, repo_type=repo_type, revision=commit, endpoint=_endpoint())
    try:
        with_retries(
            lambda: get_hf_file_metadata(url, token=_token()), what=f"read {remote_name} of hf {uri.repo_id}"
        )
    except HfHubHTTPError as exc:
        raise (error(exc, uri, repo_type) or exc) from exc


def fetch(listing: Listing, paths: list[str], dest: Path, *, max_workers: int, progress: Progress) -> None:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # tqdm bars garble step logs; Progress reports instead
    uri = listing.uri
    remote = listing.by_path()
    targets = {p: write_target(dest, p, key=remote[p].source_path, source=uri.shown) for p in paths}
    # The hub client's own folder (its resume metadata in .cache/ is not part of the copy); each file is moved
    # into place as soon as it is complete, so an interrupted download keeps every finished file.
    hub_dir = dest / (SCRATCH_PREFIX + "hub-download")

    def download(rel: str) -> None:
        # Pinned to the listed commit so every file comes from one revision.
        fetched = with_retries(
            lambda: hf_hub_download(
                uri.repo_id,
                remote[rel].source_path,
                repo_type=listing.repo_type,
                revision=listing.commit_sha,
                local_dir=hub_dir,
                token=_token(),
                endpoint=_endpoint(),
            ),
            what=f"download {uri.shown} {rel}",
        )
        os.replace(fetched, targets[rel])

    try:
        run_parallel(download, paths, max_workers)
    except (HfHubHTTPError, LocalEntryNotFoundError) as exc:
        cause = exc if isinstance(exc, HfHubHTTPError) else exc.__cause__
        mapped = error(cause, uri, listing.repo_type) if isinstance(cause, Exception) else None
        raise (mapped or StorageError(f"download of {uri.shown} failed: {exc}")) from exc
    except OSError as exc:
        raise (truncated(exc, listing) or exc) from exc
    shutil.rmtree(hub_dir, ignore_errors=True)


def truncated(exc: BaseException, listing: Listing) -> IntegrityError | None:
    """The hub client's own size check ("Consistency check failed: file should be of size N but has size M",
    naming a signed URL) as an IntegrityError naming the listed file(s) of that size."""
    sizes = re.search(r"should be of size (\d+) but has size (\d+)", str(exc))
    if sizes is None:
        return None
    names = [f.path for f in listing.files if f.size == int(sizes[1])] or ["a file"]
    return IntegrityError(
        f"{listing.uri.shown}: {', '.join(names)} arrived with {sizes[2]} bytes, the hub states {sizes[1]} (a "
        "truncated transfer)."
    )


def verify_cached(listing: Listing) -> list[IntegrityError]:
    """Check the listed files the hub client's own cache holds (where `datasets` downloads hub files) against
    the listing's sha256 / git blob id; damaged copies are removed from the cache so a reload fetches them
    again. Returns one IntegrityError per damaged file."""
    from huggingface_hub import try_to_load_from_cache

    damaged = []
    for remote in listing.files:
        cached = try_to_load_from_cache(
            listing.uri.repo_id, remote.source_path, revision=listing.commit_sha, repo_type=listing.repo_type
        )
        if not isinstance(cached, str):
            continue  # not fetched by this load
        try:
            verify(Path(cached), remote, listing.uri.shown)
        except IntegrityError as exc:
            damaged.append(exc)
            blob = Path(cached).resolve()
            Path(cached).unlink()
            blob.unlink(missing_ok=True)
    return damaged


# --- destinations ---------------------------------------------------------------------------------------------


@dataclass
class Destination:
    uri: StorageUri
    api: object
    private: bool
    commit_message: str
    head: str | None = None  # the commit `existing` saw; a commit fails if the branch moved meanwhile
    exists: bool = True


def is_root(uri: StorageUri) -> bool:
    return False  # a repo root is a fine destination: the repo is ours


def require_credentials(uri: StorageUri) -> None:
    if not os.environ.get("HF_TOKEN"):
        raise StorageError(
            f"cannot push to {uri.shown}: HF_TOKEN is not set. Set it (from a Kubernetes Secret) to a token with "
            "write access to the repo's namespace."
        )


# What a token may write, as the hub's /api/whoami-v2 states it (`auth.accessToken`): role "read" writes nothing;
# "write" writes to the account's own namespace and to organizations where its role is above "read";
# "fineGrained" writes where a `fineGrained.scoped` entry for the namespace (user / org) or the repo itself holds
# "repo.write" (hub settings/tokens; huggingface_hub's HfApi.whoami returns this body unchanged).
_ORG_WRITE_ROLES = {"admin", "write", "contributor"}


def _may_write(who: dict, repo_id: str) -> str | None:
    """None when the whoami body says the token may write to `repo_id`; else why not."""
    namespace = repo_id.split("/")[0]
    token = (who.get("auth") or {}).get("accessToken") or {}
    role = token.get("role")
    account = who.get("name", "?")
    if role == "read":
        return f"the token in HF_TOKEN (account {account!r}) is read-only: use a token with write access"
    if role == "fineGrained":
        scoped = (token.get("fineGrained") or {}).get("scoped") or []
        if any(
            (s.get("entity") or {}).get("name") in (namespace, repo_id)
            and "repo.write" in s.get("permissions", [])
            for s in scoped
        ):
            return None
        return (f"the fine-grained token in HF_TOKEN (account {account!r}) has no repo.write permission on "
                f"{namespace!r}: add it to the token, or use a write token")  # fmt: skip
    orgs = {o.get("name"): o.get("roleInOrg") for o in who.get("orgs") or []}
    if namespace == account or orgs.get(namespace) in _ORG_WRITE_ROLES:
        return None
    if namespace in orgs:
        return f"the account {account!r} of HF_TOKEN has only the {orgs[namespace]!r} role in {namespace!r}"
    return f"the account {account!r} of HF_TOKEN may not write to the namespace {namespace!r}"


def probe(uri: StorageUri, *, endpoint_url: str | None) -> None:
    """Ask the hub what the token may do (whoami) and whether it may write to the repo's namespace; nothing is
    created or committed."""
    from huggingface_hub.errors import HfHubHTTPError

    if uri.repo_type not in (None, "model"):
        raise ValueError(f"cannot publish to {uri.shown!r}: only model repos are supported")
    try:
        who = with_retries(lambda: _api().whoami(), what="ask the hub who HF_TOKEN is")
    except HfHubHTTPError as exc:
        if status_code(exc) == 401:
            raise StorageError(
                f"the hub refuses the token in HF_TOKEN (401, invalid or expired): cannot push to {uri.shown}. "
                "Put a valid write token in the Secret."
            ) from exc
        raise StorageError(f"cannot ask the hub about HF_TOKEN for {uri.shown}: {exc}") from exc
    why = _may_write(who, uri.repo_id)
    if why:
        raise StorageError(f"cannot push to {uri.shown}: {why}.")


def destination(
    uri: StorageUri, *, endpoint_url: str | None, private: bool, base_image: str = "", commit_message: str
) -> Destination:
    from huggingface_hub.utils import disable_progress_bars

    if uri.repo_type not in (None, "model"):
        raise ValueError(f"cannot publish to {uri.shown!r}: only model repos are supported")
    disable_progress_bars()
    return Destination(uri, _api(), private, commit_message)


def _mapped(dest: Destination, action):
    from huggingface_hub.errors import HfHubHTTPError

    try:
        return action()
    except HfHubHTTPError as exc:
        raise (error(exc, dest.uri) or StorageError(f"push to {dest.uri.shown} failed: {exc}")) from exc


def existing(dest: Destination) -> list[RemoteFile]:
    """Files under the URI's path in the repo; notes the head commit and whether the repo exists."""
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    uri = dest.uri

    def read():
        try:
            return dest.api.repo_info(
                uri.repo_id, repo_type="model", revision=uri.revision, files_metadata=True
            )
        except RevisionNotFoundError as exc:
            raise StorageError(
                f"branch {uri.revision!r} does not exist in {uri.repo_id}: create it first or push to main."
            ) from exc
        except RepositoryNotFoundError:
            return None

    info = _mapped(dest, lambda: with_retries(read, what=f"list {uri.shown}"))
    dest.exists, dest.head = info is not None, info.sha if info else None
    prefix = uri.path.strip("/")
    files = []
    for sibling in (info.siblings or []) if info else []:
        name = sibling.rfilename
        if prefix and not name.startswith(prefix + "/"):
            continue
        rel = name[len(prefix) + 1 :] if prefix else name
        if not prefix and rel in _REPO_FILES:
            continue
        files.append(_remote_file(rel, sibling))
    return files


def _join(prefix: str, rel: str) -> str:
    return f"{prefix}/{rel}" if prefix else rel


def put(
    dest: Destination, src: Path, records: list[FileRecord], remove: list[str], *, max_workers: int,
    progress: Progress,
) -> None:  # fmt: skip
    """Write `records` and remove `remove` in ONE commit (atomic; the repo is created when missing)."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    uri, api = dest.uri, dest.api
    prefix = uri.path.strip("/")
    if not dest.exists:
        if uri.revision not in (None, "main"):
            raise StorageError(f"{uri.repo_id} does not exist yet: push to its main branch first.")
        log.info("creating %s model repo %s", "private" if dest.private else "public", uri.repo_id)
        _mapped(dest, lambda: with_retries(
            lambda: api.create_repo(uri.repo_id, repo_type="model", private=dest.private, exist_ok=True),
            what=f"create repo {uri.repo_id}",
        ))  # fmt: skip
    log.info("%s: committing %d files (%s), removing %d", uri.shown, len(records),
             human(sum(r.size for r in records)), len(remove))  # fmt: skip

    def commit() -> None:
        # Fresh operations per attempt: the client marks them as used. LFS objects an earlier attempt (or an
        # interrupted run) uploaded are recognised by the hub and not sent again.
        operations = [CommitOperationAdd(_join(prefix, r.path), str(src / r.path)) for r in records]
        operations += [CommitOperationDelete(_join(prefix, p)) for p in remove]
        api.create_commit(
            uri.repo_id,
            operations,
            commit_message=dest.commit_message,
            repo_type="model",
            revision=uri.revision,
            parent_commit=dest.head,  # fails instead of silently mixing with a concurrent push
        )

    _mapped(dest, lambda: with_retries(commit, what=f"commit to {uri.shown}"))
    for record in records:
        progress.file_done(record.size)


def read_text(dest: Destination, rel: str) -> str:
    """A small file of the repo at the head commit `existing` saw."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = _mapped(dest, lambda: with_retries(
            lambda: dest.api.hf_hub_download(
                dest.uri.repo_id, _join(dest.uri.path.strip("/"), rel), repo_type="model", revision=dest.head,
                local_dir=tmp,
            ),
            what=f"read {rel} from {dest.uri.shown}",
        ))  # fmt: skip
        return Path(path).read_text(errors="replace")
