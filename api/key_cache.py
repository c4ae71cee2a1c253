"""Tenant keys verified recently, so a request does not read SQL to authenticate.

An entry lives ``TORCHYARD_KEY_CACHE_S`` (default 5 s): that bounds how long a key revoked through another
API process keeps working here. The process that revokes a key drops it at once (``forget``). Entries are
keyed by a BLAKE2b digest of the whole key, never by the key itself, so a memory dump holds no usable key;
a keyed hash with a per-process random key makes the digests useless outside this process too.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from typing import Generic, TypeVar

from cachetools import TTLCache

T = TypeVar("T")
_MAX_ENTRIES = 10_000


class KeyCache(Generic[T]):
    def __init__(self, ttl_s: float):
        self.ttl_s = ttl_s
        self._salt = secrets.token_bytes(16)
        # digest -> (key id, value). Full: expired entries go first, then the least recently used.
        self._entries: TTLCache[bytes, tuple[str, T]] | None = (
            TTLCache(maxsize=_MAX_ENTRIES, ttl=ttl_s, timer=time.monotonic) if ttl_s > 0 else None)
        self._lock = threading.Lock()  # TTLCache is not thread-safe, and every read may expire entries

    def _digest(self, token: str) -> bytes:
        return hashlib.blake2b(token.encode(), key=self._salt, digest_size=20).digest()

    def get(self, token: str) -> T | None:
        if self._entries is None:
            return None
        digest = self._digest(token)
        with self._lock:
            entry = self._entries.get(digest)
        return None if entry is None else entry[1]

    def put(self, token: str, key_id: str, value: T) -> None:
        if self._entries is None:
            return
        digest = self._digest(token)
        with self._lock:
            self._entries[digest] = (key_id, value)

    def forget(self, key_id: str) -> None:
        """Drop every entry of ``key_id`` (revoked here): its next request asks SQL."""
        if self._entries is None:
            return
        with self._lock:
            for digest in [d for d, (owner, _) in self._entries.items() if owner == key_id]:
                self._entries.pop(digest, None)
