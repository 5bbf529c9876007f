"""A local Hugging Face Hub stand-in: enough of the hub's HTTP API for the real `huggingface_hub` and
`datasets` clients (snapshot_download, hf_hub_download, HfApi.model_info/dataset_info/list_repo_tree/
get_paths_info, HfFileSystem, datasets.load_dataset) pointed at it through HF_ENDPOINT.

Repos are served from local folders; each revision (branch or tag) maps to a folder and gets a commit sha
derived from its content. Like the hub: large/binary files are "LFS" (ETag and X-Linked-Etag are the sha256,
the listing carries `lfs.oid`), other files' ETag is their git blob id; errors carry `X-Error-Code`
(RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo). As on the hub, a gated repo's info, tree and
paths-info are readable by anyone; its files (`/resolve/`) answer 401 without a token and 403 with a token it
does not accept. LFS files are not served by `/resolve/` itself: it answers 302 with the X-Linked-* headers and a
signed absolute `Location` on another host name (`localhost` instead of 127.0.0.1, as the hub redirects to its
CDN), which refuses a request that still carries an `Authorization` header (400, as a presigned S3/CloudFront URL
does: one auth mechanism only). Tree listings are paginated with a `Link: <…?cursor=…>; rel="next"` header
(`tree_page_size`, 1000 entries on the hub). Faults: `fail_once(path, mode)` makes the next GET of a file drop the
connection half-way ("drop"), answer 500 ("500"), send half and hang until `release()` ("stall", to kill
a client mid-download), send bytes of the right length with some flipped ("corrupt": for an LFS file at the CDN
URL, for a regular file at `/resolve/`), or send the first half with a Content-Length that matches it
("truncate": a stream that ends early yet looks complete); `times=` repeats a fault. Every request is recorded in `requests`.

Writes, for HfApi.create_repo / create_commit / upload_folder with a token: `POST /api/repos/create` (the repo
starts with a `.gitattributes` commit, readable by the creating token when private), `/api/validate-yaml`,
`/api/models/<repo>/preupload/<rev>` (answers "lfs" for weight-like or large files, else "regular", and the
current oid so the client skips unchanged files), the git-LFS batch API with the plain "basic" transfer (a
PUT of the whole object, sha256 and size checked; objects already stored get no upload action, which is how
an interrupted push resumes) and `/api/models/<repo>/commit/<rev>` (ndjson; `parentCommit` is checked).
Tokens: `add_token(token, account, role, orgs)` registers what `GET /api/whoami-v2` answers for it (the hub's
body: `name`, `orgs[].roleInOrg`, `auth.accessToken.role` read / write / fineGrained with `fineGrained.scoped`);
an unregistered or missing token gets 401 there, as on the hub. A "read" token is refused every write (403), as
the hub refuses writes with a read token even to the account's own repos; other roles write as before.
The stand-in offers no Xet storage, and production uses none either: components/_shared/storage/hf.py switches
Xet off (HF_HUB_DISABLE_XET) for every process that imports it, so the tests run the path production runs
(`hub_env` leaves the variable unset on purpose).
`fail_once(<sha256>, mode)` applies the same faults to the PUT of that LFS object; `puts_of(sha256)` counts
them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import tempfile
import threading
import urllib.parse
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from tests.support.fault_proxy import flip

LFS_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt", ".h5", ".msgpack", ".parquet", ".arrow", ".model")
LFS_MIN_SIZE = 10 * 1024


@dataclass
class RepoFile:
    path: str
    local: Path
    size: int
    sha256: str
    git_oid: str
    lfs: bool


@dataclass
class Revision:
    commit: str
    files: dict[str, RepoFile]


@dataclass
class Repo:
    repo_id: str
    repo_type: str
    revisions: dict[str, Revision]
    gated: bool = False
    private: bool = False
    tokens: set[str] = field(default_factory=set)

    def resolve(self, revision: str) -> Revision | None:
        if revision in self.revisions:
            return self.revisions[revision]
        return next((r for r in self.revisions.values() if r.commit == revision), None)


def _is_lfs(path: str, size: int) -> bool:
    return Path(path).suffix in LFS_SUFFIXES or size >= LFS_MIN_SIZE


def _repo_file(rel: str, local: Path, data: bytes, lfs: bool) -> RepoFile:
    git_oid = hashlib.sha1(f"blob {len(data)}\0".encode() + data, usedforsecurity=False).hexdigest()
    return RepoFile(rel, local, len(data), hashlib.sha256(data).hexdigest(), git_oid, lfs)


def _scan(folder: Path) -> dict[str, RepoFile]:
    files = {}
    for local in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = local.read_bytes()
        rel = local.relative_to(folder).as_posix()
        files[rel] = _repo_file(rel, local, data, _is_lfs(rel, len(data)))
    return files


class HubStandin:
    """Run with `with HubStandin() as hub:`; `hub.endpoint` is the value for HF_ENDPOINT."""

    def __init__(self) -> None:
        self.repos: dict[tuple[str, str], Repo] = {}
        self.requests: list[tuple[str, str, int]] = []
        self._faults: dict[str, tuple[str, int]] = {}  # path -> (mode, how many more requests)
        self._storage = Path(tempfile.mkdtemp(prefix="hub-standin-"))  # pushed files and LFS objects
        self.lfs_objects: dict[str, Path] = {}  # sha256 -> stored object
        self.cdn_files: dict[str, tuple[Revision, RepoFile]] = {}  # sha256 -> what the CDN URL serves
        self.stalled = 0  # LFS uploads currently held by a "stall" fault
        self.tree_page_size = 1000  # entries per /tree page, as the hub's
        self.accounts: dict[str, dict] = {}  # token -> the whoami-v2 body (add_token)
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def add_repo(
        self,
        repo_id: str,
        revisions: dict[str, str | Path] | str | Path,
        *,
        repo_type: str = "model",
        gated: bool = False,
        private: bool = False,
        tokens: tuple[str, ...] = (),
    ) -> Repo:
        """Serve `revisions` ({"main": folder, "v1": other_folder} or one folder as main) as `repo_id`."""
        if not isinstance(revisions, dict):
            revisions = {"main": revisions}
        revs = {}
        for name, folder in revisions.items():
            files = _scan(Path(folder))
            fingerprint = json.dumps([(f.path, f.sha256) for f in files.values()])
            commit = hashlib.sha1(f"{repo_id}@{fingerprint}".encode(), usedforsecurity=False).hexdigest()
            revs[name] = Revision(commit, files)
        repo = Repo(repo_id, repo_type, revs, gated=gated, private=private, tokens=set(tokens))
        self.repos[(repo_type, repo_id)] = repo
        return repo

    def add_token(
        self, token: str, account: str, *, role: str = "write", orgs: dict[str, str] | None = None,
        scoped: list[dict] | None = None,
    ) -> None:  # fmt: skip
        """Register `token` of user `account`: `role` read, write or fineGrained (then `scoped`: the hub's
        `fineGrained.scoped` entries, e.g. [{"entity": {"type": "org", "name": "acme"}, "permissions":
        ["repo.write"]}]), `orgs` {org: roleInOrg}."""
        access = {"displayName": f"{account}-token", "role": role, "createdAt": "2026-01-01T00:00:00.000Z"}
        if role == "fineGrained":
            access["fineGrained"] = {"global": [], "scoped": scoped or [], "canReadGatedRepos": True}
        self.accounts[token] = {
            "type": "user",
            "id": hashlib.sha1(account.encode(), usedforsecurity=False).hexdigest()[:24],
            "name": account,
            "fullname": account,
            "isPro": False,
            "orgs": [{"type": "org", "name": o, "roleInOrg": r} for o, r in (orgs or {}).items()],
            "auth": {"type": "access_token", "accessToken": access},
        }

    def fail_once(self, path: str, mode: str = "drop", *, times: int = 1) -> None:
        """The next GET of repo file `path` (or PUT of the LFS object whose sha256 is `path`) fails: "drop"
        closes the connection half-way, "500" answers 500, "stall" sends (or reads) half and hangs until
        `release()`; for GETs "corrupt" sends the right length with flipped bytes, "truncate" half the bytes
        with a matching Content-Length. `times`: the next that many requests."""
        if mode not in ("drop", "500", "stall", "corrupt", "truncate"):
            raise ValueError(mode)
        with self._lock:
            self._faults[path] = (mode, times)

    def release(self) -> None:
        """Let stalled responses finish (by closing them)."""
        self._released.set()

    def take_fault(self, path: str) -> str | None:
        with self._lock:
            mode, times = self._faults.pop(path, (None, 0))
            if times > 1:
                self._faults[path] = (mode, times - 1)
            return mode

    def record(self, method: str, path: str, status: int) -> None:
        with self._lock:
            self.requests.append((method, path, status))

    def gets_of(self, filename: str) -> int:
        """GETs of a file's bytes: `/resolve/` for regular files, the CDN redirect target for LFS files."""
        return sum(
            1
            for m, p, _ in self.requests
            if m == "GET"
            and ("/resolve/" in p or p.startswith("/cdn-lfs/"))
            and p.split("?")[0].endswith(filename)
        )

    def puts_of(self, sha256: str) -> int:
        """Completed LFS uploads of the object `sha256`."""
        return sum(1 for m, p, s in self.requests if m == "PUT" and p == f"/lfs-upload/{sha256}" and s == 200)

    def store(self, data: bytes) -> Path:
        """Keep pushed bytes, content-addressed."""
        path = self._storage / hashlib.sha256(data).hexdigest()
        if not path.exists():
            tmp = path.with_suffix(".tmp-" + threading.current_thread().name)
            tmp.write_bytes(data)
            tmp.replace(path)
        return path

    def commit(self, repo: Repo, branch: str, header: dict, operations: list[dict]) -> Revision:
        """Apply one ndjson commit to `branch` (atomically: all operations or none)."""
        with self._lock:
            parent = repo.revisions[branch]
            if header.get("parentCommit") and header["parentCommit"] != parent.commit:
                raise _HubError(412, None, "A commit has happened since. Please refresh and try again.")
            files = dict(parent.files)
            for op in operations:
                key, value = op["key"], op["value"]
                path = value["path"].strip("/")
                if key == "file":
                    data = base64.b64decode(value["content"])
                    files[path] = _repo_file(path, self.store(data), data, False)
                elif key == "lfsFile":
                    stored = self.lfs_objects.get(value["oid"])
                    if stored is None:
                        raise _HubError(422, None, f"LFS object {value['oid']} for {path} was not uploaded")
                    files[path] = _repo_file(path, stored, stored.read_bytes(), True)
                elif key == "deletedFile":
                    if files.pop(path, None) is None:
                        raise _HubError(404, "EntryNotFound", f"A file with this name doesn't exist: {path}")
                elif key == "deletedFolder":
                    files = {p: f for p, f in files.items() if not p.startswith(path + "/")}
                else:
                    raise _HubError(400, None, f"unknown commit operation {key}")
            digest = hashlib.sha1(parent.commit.encode(), usedforsecurity=False)
            digest.update(json.dumps([(f.path, f.sha256) for f in files.values()]).encode())
            revision = Revision(digest.hexdigest(), files)
            repo.revisions[branch] = revision
            return revision

    def __enter__(self) -> HubStandin:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()
        shutil.rmtree(self._storage, ignore_errors=True)


class _HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


def _tree_entry(f: RepoFile) -> dict:
    entry = {"type": "file", "path": f.path, "size": f.size, "oid": f.git_oid}
    if f.lfs:
        entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
    return entry


def _folders(files: dict[str, RepoFile]) -> set[str]:
    folders = set()
    for path in files:
        parts = path.split("/")[:-1]
        folders.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    return folders


def _make_handler(hub: HubStandin) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # keep test output quiet
            pass

        # --- plumbing -------------------------------------------------------------------------------------

        def _send_json(self, status: int, body: object, headers: dict | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            hub.record(self.command, self.path, status)

        def _send_error(self, err: _HubError) -> None:
            headers = {"X-Error-Message": err.message}
            if err.code:
                headers["X-Error-Code"] = err.code
            if err.commit:
                headers["X-Repo-Commit"] = err.commit
            self._send_json(err.status, {"error": err.message}, headers)

        def _token(self) -> str | None:
            auth = self.headers.get("Authorization", "")
            return auth[7:] if auth.startswith("Bearer ") else None

        def _repo(self, repo_type: str, repo_id: str, *, files: bool = False) -> Repo:
            """The repo a request names; `files`: the request reads file contents, which a gated repo guards
            (its info and listings stay public, as on the hub)."""
            repo = hub.repos.get((repo_type, repo_id))
            token = self._token()
            if repo is None or (repo.private and token not in repo.tokens):
                # Like the hub: anonymous callers get 401 for a missing or private repo.
                status = 404 if token else 401
                raise _HubError(status, "RepoNotFound", f"Repository Not Found for {repo_type} {repo_id}.")
            if files and repo.gated and token not in repo.tokens:
                if token is None:
                    raise _HubError(401, "GatedRepo", f"Access to {repo_type} {repo_id} is restricted.")
                raise _HubError(
                    403, "GatedRepo", f"Access to {repo_type} {repo_id} is restricted for this token."
                )
            return repo

        @staticmethod
        def _revision(repo: Repo, revision: str) -> Revision:
            rev = repo.resolve(revision)
            if rev is None:
                raise _HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return rev

        def _query(self) -> dict[str, list[str]]:
            return urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)

        def _read_body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while (size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)) > 0:
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                self.rfile.readline()  # the blank line after the last chunk
                return b"".join(chunks)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _read_only(self) -> bool:
            account = hub.accounts.get(self._token() or "")
            return bool(account) and account["auth"]["accessToken"]["role"] == "read"

        def _writable(self, repo: Repo) -> None:
            if self._token() not in repo.tokens or self._read_only():
                raise _HubError(403, None, f"You don't have the rights to write to {repo.repo_id}.")

        def _route(self) -> None:
            parsed = urllib.parse.urlsplit(self.path)
            segments = [urllib.parse.unquote(s) for s in parsed.path.split("/") if s]
            query = urllib.parse.parse_qs(parsed.query)
            try:
                if self.command in ("GET", "HEAD") and segments[:1] == ["cdn-lfs"] and len(segments) >= 3:
                    self._cdn(segments[1], "/".join(segments[2:]), query)
                elif self.command == "PUT" and segments[:1] == ["lfs-upload"] and len(segments) == 2:
                    self._lfs_put(segments[1])
                elif self.command == "POST" and segments[:1] == ["lfs-verify"] and len(segments) == 2:
                    self._lfs_verify(segments[1])
                elif self.command == "GET" and segments == ["api", "whoami-v2"]:
                    account = hub.accounts.get(self._token() or "")
                    if account is None:  # the hub: 401 for a missing, unknown or revoked token
                        raise _HubError(401, None, "Invalid credentials in Authorization header")
                    self._send_json(200, account)
                elif self.command == "POST" and segments == ["api", "repos", "create"]:
                    self._create_repo()
                elif self.command == "POST" and segments == ["api", "validate-yaml"]:
                    self._validate_yaml()
                elif self.command == "POST" and segments[-4:] == ["info", "lfs", "objects", "batch"]:
                    self._lfs_batch(segments)
                elif segments[:1] == ["api"] and len(segments) >= 4 and segments[1] in ("models", "datasets"):
                    self._api(segments[1][:-1], "/".join(segments[2:4]), segments[4:], query)
                elif len(segments) >= 5 and segments[0] == "datasets" and segments[3] == "resolve":
                    self._resolve("dataset", "/".join(segments[1:3]), segments[4], "/".join(segments[5:]))
                elif len(segments) >= 4 and segments[2] == "resolve":
                    self._resolve("model", "/".join(segments[:2]), segments[3], "/".join(segments[4:]))
                else:
                    raise _HubError(404, None, f"no route for {parsed.path}")
            except _HubError as err:
                self._send_error(err)

        do_GET = do_HEAD = do_POST = do_PUT = _route

        # --- API ------------------------------------------------------------------------------------------

        def _api(self, repo_type: str, repo_id: str, rest: list[str], query: dict) -> None:
            repo = self._repo(repo_type, repo_id)
            if self.command == "POST" and len(rest) >= 2 and rest[0] in ("preupload", "commit"):
                self._writable(repo)
                rev = self._revision(repo, rest[1])
                branch = rest[1] if rest[1] in repo.revisions else None
                if branch is None:
                    raise _HubError(400, None, f"can only write to a branch, not {rest[1]}")
                if rest[0] == "preupload":
                    self._preupload(rev)
                else:
                    self._commit(repo, branch)
            elif not rest or rest[0] == "revision":
                rev = self._revision(repo, rest[1] if len(rest) > 1 else "main")
                blobs = query.get("blobs", ["false"])[0].lower() == "true"
                siblings = []
                for f in rev.files.values():
                    sibling: dict = {"rfilename": f.path}
                    if blobs:
                        sibling.update(size=f.size, blobId=f.git_oid)
                        if f.lfs:
                            sibling["lfs"] = {"size": f.size, "sha256": f.sha256, "pointerSize": 134}
                    siblings.append(sibling)
                body = {
                    "_id": repo_id,
                    "id": repo_id,
                    "author": repo_id.split("/")[0],
                    "sha": rev.commit,
                    "lastModified": "2026-01-01T00:00:00.000Z",
                    "private": repo.private,
                    "gated": "manual" if repo.gated else False,
                    "disabled": False,
                    "tags": [],
                    "siblings": siblings,
                }
                self._send_json(200, body)
            elif rest[0] == "tree" and len(rest) >= 2:
                rev = self._revision(repo, rest[1])
                self._tree(rev, "/".join(rest[2:]), query.get("recursive", ["false"])[0].lower() == "true")
            elif rest[0] == "paths-info" and len(rest) >= 2:
                rev = self._revision(repo, rest[1])
                length = int(self.headers.get("Content-Length") or 0)
                form = urllib.parse.parse_qs(self.rfile.read(length).decode())
                folders = _folders(rev.files)
                entries = []
                for path in form.get("paths", []):
                    path = path.strip("/")
                    if path in rev.files:
                        entries.append(_tree_entry(rev.files[path]))
                    elif path in folders or path == "":
                        entries.append({"type": "directory", "path": path, "oid": rev.commit})
                self._send_json(200, entries)
            else:
                raise _HubError(404, None, f"unsupported API call {'/'.join(rest)}")

        def _tree(self, rev: Revision, path: str, recursive: bool) -> None:
            path = path.strip("/")
            folders = _folders(rev.files)
            if path and path not in folders:
                raise _HubError(404, "EntryNotFound", f"{path} does not exist on this revision")
            prefix = f"{path}/" if path else ""
            entries = []
            for folder in sorted(folders):
                if folder.startswith(prefix) and (recursive or "/" not in folder[len(prefix) :]):
                    entries.append({"type": "directory", "path": folder, "oid": rev.commit})
            for f in rev.files.values():
                if f.path.startswith(prefix) and (recursive or "/" not in f.path[len(prefix) :]):
                    entries.append(_tree_entry(f))
            # Pages of `tree_page_size` entries; the next page's URL in a Link header, as the hub answers and
            # huggingface_hub's `paginate()` follows (utils/_pagination.py).
            start = int(cursor) if (cursor := self._query().get("cursor", [""])[0]) else 0
            page = entries[start : start + hub.tree_page_size]
            headers = {}
            if start + hub.tree_page_size < len(entries):
                parsed = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(parsed.query)
                query["cursor"] = [str(start + hub.tree_page_size)]
                following = urllib.parse.urlunsplit(
                    ("http", self.headers["Host"], parsed.path, urllib.parse.urlencode(query, doseq=True), "")
                )
                headers["Link"] = f'<{following}>; rel="next"'
            self._send_json(200, page, headers)

        # --- writes ---------------------------------------------------------------------------------------

        def _create_repo(self) -> None:
            token = self._token()
            if token is None:
                raise _HubError(401, None, "Invalid username or password.")
            if self._read_only():
                raise _HubError(403, None, "You don't have the rights to create a repo (read-only token).")
            body = json.loads(self._read_body() or b"{}")
            repo_type = body.get("type") or "model"
            repo_id = f"{body['organization']}/{body['name']}" if body.get("organization") else body["name"]
            if (repo_type, repo_id) in hub.repos:
                raise _HubError(409, None, f"You already created this {repo_type} repo")
            private = body.get("visibility", "private" if body.get("private") else "public") == "private"
            gitattributes = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
            initial = {
                ".gitattributes": _repo_file(".gitattributes", hub.store(gitattributes), gitattributes, False)
            }
            commit = hashlib.sha1(f"{repo_id}@initial".encode(), usedforsecurity=False).hexdigest()
            hub.repos[(repo_type, repo_id)] = Repo(
                repo_id, repo_type, {"main": Revision(commit, initial)}, private=private, tokens={token}
            )
            url = f"{hub.endpoint}/{'' if repo_type == 'model' else repo_type + 's/'}{repo_id}"
            self._send_json(200, {"url": url, "name": repo_id, "id": repo_id})

        def _validate_yaml(self) -> None:
            content = json.loads(self._read_body())["content"]
            if content.startswith("---"):
                front = content.split("---", 2)[1] if content.count("---") >= 2 else ""
                try:
                    yaml.safe_load(front)
                except yaml.YAMLError as err:
                    self._send_json(400, {"errors": [{"message": str(err)}], "warnings": []})
                    return
            self._send_json(200, {"errors": [], "warnings": []})

        def _preupload(self, rev: Revision) -> None:
            files = []
            for item in json.loads(self._read_body())["files"]:
                path = item["path"].strip("/")
                lfs = _is_lfs(path, item["size"])
                current = rev.files.get(path)
                oid = None
                if current is not None and current.lfs == lfs:
                    oid = current.sha256 if lfs else current.git_oid
                mode = "lfs" if lfs else "regular"
                files.append({"path": item["path"], "uploadMode": mode, "shouldIgnore": False, "oid": oid})
            self._send_json(200, {"files": files, "commitOid": rev.commit})

        def _commit(self, repo: Repo, branch: str) -> None:
            lines = [json.loads(line) for line in self._read_body().splitlines() if line.strip()]
            header = next((line["value"] for line in lines if line["key"] == "header"), {})
            fault = hub.take_fault("commit")
            if fault == "500":
                raise _HubError(500, None, "Internal Error (injected)")
            revision = hub.commit(repo, branch, header, [line for line in lines if line["key"] != "header"])
            url = f"{hub.endpoint}/{repo.repo_id}/commit/{revision.commit}"
            self._send_json(200, {"success": True, "commitOid": revision.commit, "commitUrl": url})

        def _lfs_batch(self, segments: list[str]) -> None:
            repo_type = "dataset" if segments[0] == "datasets" else "model"
            names = segments[1:3] if repo_type == "dataset" else segments[0:2]
            repo = self._repo(repo_type, "/".join(names).removesuffix(".git"))
            self._writable(repo)
            body = json.loads(self._read_body())
            objects = []
            for obj in body["objects"]:
                entry = {"oid": obj["oid"], "size": obj["size"]}
                if obj["oid"] not in hub.lfs_objects:  # already stored: no actions, the client skips it
                    entry["actions"] = {
                        "upload": {"href": f"{hub.endpoint}/lfs-upload/{obj['oid']}"},
                        "verify": {"href": f"{hub.endpoint}/lfs-verify/{obj['oid']}"},
                    }
                objects.append(entry)
            self._send_json(200, {"transfer": "basic", "objects": objects})

        def _lfs_put(self, oid: str) -> None:
            fault = hub.take_fault(oid)
            length = int(self.headers.get("Content-Length") or 0)
            if fault in ("drop", "stall") and length:
                self.rfile.read(length // 2)
                if fault == "stall":
                    hub.stalled += 1
                    hub._released.wait(60)
                self.close_connection = True
                self.connection.shutdown(2)
                return
            data = self._read_body()
            if fault == "500":
                raise _HubError(500, None, "Internal Error (injected)")
            if hashlib.sha256(data).hexdigest() != oid:
                raise _HubError(400, None, f"uploaded content does not match oid {oid}")
            with hub._lock:
                hub.lfs_objects[oid] = hub.store(data)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            hub.record(self.command, self.path, 200)

        def _lfs_verify(self, oid: str) -> None:
            body = json.loads(self._read_body())
            stored = hub.lfs_objects.get(oid)
            if stored is None or stored.stat().st_size != body.get("size"):
                raise _HubError(404, None, f"LFS object {oid} not found or of another size")
            self._send_json(200, {"success": True})

        # --- file downloads -------------------------------------------------------------------------------

        def _resolve(self, repo_type: str, repo_id: str, revision: str, path: str) -> None:
            repo = self._repo(repo_type, repo_id, files=True)
            rev = self._revision(repo, revision)
            f = rev.files.get(path)
            if f is None:
                raise _HubError(
                    404, "EntryNotFound", f"{path} does not exist at {revision}", commit=rev.commit
                )
            if f.lfs:
                self._redirect_to_cdn(rev, f)
                return
            self._send_file(rev, f)

        def _redirect_to_cdn(self, rev: Revision, f: RepoFile) -> None:
            """The hub's answer for an LFS file: 302 to a signed CDN URL on another host, with the file's
            metadata in X-Linked-* headers (huggingface_hub reads them from the HEAD without following it)."""
            hub.cdn_files[f.sha256] = (rev, f)
            port = self.server.server_address[1]
            quoted = urllib.parse.quote(f.path)
            location = (
                f"http://localhost:{port}/cdn-lfs/{f.sha256}/{quoted}?Expires=4102444800&Signature=standin"
            )
            self.send_response(302)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.send_header("ETag", f'"{f.git_oid}"')
            self.send_header("X-Repo-Commit", rev.commit)
            self.send_header("X-Linked-Etag", f'"{f.sha256}"')
            self.send_header("X-Linked-Size", str(f.size))
            self.end_headers()
            hub.record(self.command, self.path, 302)

        def _cdn(self, sha256: str, path: str, query: dict) -> None:
            if self.headers.get("Authorization"):
                # A presigned URL with an Authorization header too: S3 / CloudFront refuse two auth mechanisms.
                raise _HubError(400, None, "Only one auth mechanism allowed")
            served = hub.cdn_files.get(sha256)
            if served is None or query.get("Signature") != ["standin"]:
                raise _HubError(403, None, "Access Denied")
            self._send_file(*served, from_cdn=True)

        def _send_file(self, rev: Revision, f: RepoFile, *, from_cdn: bool = False) -> None:
            path = f.path
            fault = hub.take_fault(path) if self.command == "GET" else None
            if fault == "500":
                raise _HubError(500, None, "Internal Error (injected)")
            data = f.local.read_bytes()
            if fault == "corrupt":
                data = flip(data)
            elif fault == "truncate":
                data = data[: len(data) // 2]
            start, end, status = 0, len(data), 200
            range_header = self.headers.get("Range")
            if range_header and range_header.startswith("bytes="):
                first, _, last = range_header[6:].partition("-")
                start = int(first or 0)
                end = int(last) + 1 if last else len(data)
                status = 206
            etag = f.sha256 if f.lfs else f.git_oid
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(end - start))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", f'"{etag}"')
            self.send_header("Last-Modified", formatdate(usegmt=True))
            if not from_cdn:
                self.send_header("X-Repo-Commit", rev.commit)
            if f.lfs and not from_cdn:
                self.send_header("X-Linked-Etag", f'"{f.sha256}"')
                self.send_header("X-Linked-Size", str(f.size))
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
            self.end_headers()
            hub.record(self.command, self.path, status)
            if self.command == "HEAD":
                return
            body = data[start:end]
            if fault in ("drop", "stall"):
                # Announce the full length, send half, hang up: the client sees a truncated body.
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                if fault == "stall":
                    hub._released.wait(60)
                self.close_connection = True
                self.connection.shutdown(2)
                return
            self.wfile.write(body)

    return Handler
