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

T = TypeVar("T")
_MAX_ENTRIES = 10_000


class KeyCache(Generic[T]):
    def __init__(self, ttl_s: float):
        self.ttl_s = ttl_s
        self._salt = secrets.token_bytes(16)
        self._entries: dict[bytes, tuple[float, str, T]] = {}  # digest -> (expires at, key id, value)
        self._lock = threading.Lock()

    def _digest(self, token: str) -> bytes:
        return hashlib.blake2b(token.encode(), key=self._salt, digest_size=20).digest()

    def get(self, token: str) -> T | None:
        if self.ttl_s <= 0:
            return None
        entry = self._entries.get(self._digest(token))
        if entry is None or entry[0] <= time.monotonic():
            return None
        return entry[2]

    def put(self, token: str, key_id: str, value: T) -> None:
        if self.ttl_s <= 0:
            return
        with self._lock:
            if len(self._entries) >= _MAX_ENTRIES:
                now = time.monotonic()
                self._entries = {d: e for d, e in self._entries.items() if e[0] > now}
                if len(self._entries) >= _MAX_ENTRIES:
                    self._entries.clear()  # many live keys at once: start over rather than grow without bound
            self._entries[self._digest(token)] = (time.monotonic() + self.ttl_s, key_id, value)

    def forget(self, key_id: str) -> None:
        """Drop every entry of ``key_id`` (revoked here): its next request asks SQL."""
        with self._lock:
            self._entries = {d: e for d, e in self._entries.items() if e[1] != key_id}
