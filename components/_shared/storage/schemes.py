"""The scheme modules, by URI scheme. The verbs (fetch.py, publish.py) look a scheme up here and never branch on
its name. Each scheme module provides:

    list_files(uri, *, repo_type, endpoint_url) -> Listing     what the source holds (names still untrusted)
    fetch(listing, paths, dest, *, max_workers, progress)      writes each file through names.write_target
    COUNTS_FILES_ON_DISK                                       True when its client has no per-file callback
    WRITABLE                                                   False: not a publish destination
    require_read(listing)  (optional)                          reads one file's metadata where a listing does
                                                               not prove read access (s3: GetObject)
and, when WRITABLE:
    ATOMIC_CHANGES                                             True: one put is applied whole (a commit)
    OWNS_DESTINATION                                           True: every file there is ours (a hub repo);
                                                               False: only what an earlier manifest lists
    is_root(uri) -> bool                                       a whole disk or bucket: never a destination
    require_credentials(uri)                                   fails before any transfer
    destination(uri, *, endpoint_url, private, base_image, commit_message) -> a handle (.head: the hf:// commit
                                                               or the oci:// manifest digest)
    existing(dest) -> list[RemoteFile]                         what the destination holds, with its checksums
    read_text(dest, rel) -> str                                a file there (an earlier manifest; not OWNS_...)
    put(dest, src, records, remove, *, max_workers, progress)  writes `records`, then removes `remove`
    probe(uri, *, endpoint_url)                                the credentials may write there; leaves nothing
and maps its client's errors to StorageError messages itself (its `error` function).
"""

from __future__ import annotations

from types import ModuleType

from . import hf, https, local, oci, s3
from .uri import StorageUri

SCHEMES: dict[str, ModuleType] = {"hf": hf, "s3": s3, "file": local, "https": https, "oci": oci}


def scheme_module(uri: StorageUri) -> ModuleType:
    return SCHEMES[uri.scheme]
