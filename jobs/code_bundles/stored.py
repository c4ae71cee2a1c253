"""Code bundles in the object store (TORCHYARD_STORAGE_URL), for workers that do not share the API's bundles directory.

The API keeps every bundle on its own disk (files.py) and, with a store, puts the archive there too before it answers
the upload, at ``bundles/<owner directory>/<hex>.tar`` (the owner's directory name is the same digest of the owner as
on disk). A worker whose bundles directory lacks the archive downloads it before it unpacks a job's code; the archive is
checked against its digest there as always, so a store that holds other bytes gives a refused bundle, never other code.
"""

from __future__ import annotations

import logging
import os
import secrets

from jobs.code_bundles.files import BUNDLES_DIR_MODE, BUNDLES_FILE_MODE, archive_path, hex_of, owner_dir
from jobs.settings import Settings
from jobs.storage.store import NotInStore, store_for

log = logging.getLogger(__name__)


def bundle_key(settings: Settings, owner: str, digest: str) -> str:
    return f"bundles/{owner_dir(settings, owner).name}/{hex_of(digest)}.tar"


def publish(settings: Settings, owner: str, digest: str) -> None:
    """Put the stored archive into the object store unless it is there already (a no-op without a store); StoreError
    when the store does not take it."""
    store = store_for(settings)
    if store is None:
        return
    key, archive = bundle_key(settings, owner, digest), archive_path(settings, owner, digest)
    if store.size(key) == archive.stat().st_size:
        return
    store.put_file(key, archive)
    log.info("code bundle %s of %s put into the object store", digest, owner_dir(settings, owner).name)


def fetch(settings: Settings, owner: str, digest: str) -> bool:
    """Download the archive from the object store into this host's bundles directory when it is missing here; False
    when there is no store or the store does not hold it, StoreError when the store does not answer."""
    store = store_for(settings)
    archive = archive_path(settings, owner, digest)
    if store is None or archive.is_file():
        return archive.is_file()
    archive.parent.mkdir(mode=BUNDLES_DIR_MODE, parents=True, exist_ok=True)
    tmp = archive.with_name(f".fetch-{secrets.token_hex(6)}.tar")
    try:
        store.get_file(bundle_key(settings, owner, digest), tmp)
        os.chmod(tmp, BUNDLES_FILE_MODE)
        os.replace(tmp, archive)  # whole or absent: the digest is checked when it is unpacked
    except NotInStore:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    log.info("code bundle %s downloaded from the object store", digest)
    return True
