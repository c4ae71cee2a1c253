"""``s3://BUCKET[/PREFIX]``: where a deployment keeps its jobs' files, parsed once with errors in the operator's words."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

# S3's own bucket naming rules (lower case, digits, dots, hyphens; 3 to 63 characters; no IP address).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_IP = re.compile(r"^\d+\.\d+\.\d+\.\d+$")
_PREFIX_PART = re.compile(r"^[A-Za-z0-9!_.*'()=+,;@$-]+$")
EXAMPLE = "s3://my-bucket/torchyard"


class StorageUrlError(ValueError):
    """TORCHYARD_STORAGE_URL is not an s3:// URL of a bucket and an optional prefix."""


@dataclass(frozen=True)
class StorageUrl:
    bucket: str
    prefix: str  # without slashes at either end; "" for the bucket's root

    def key(self, *parts: str) -> str:
        """The object key of ``parts`` joined under the prefix."""
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


def parse(value: str) -> StorageUrl:
    """The bucket and prefix of ``value``; StorageUrlError saying what is wrong (never a credential: a URL with
    user information is refused without repeating it)."""
    text = value.strip()
    if not text.startswith("s3://"):
        scheme = text.split("://", 1)[0] if "://" in text else ""
        found = f"a {scheme}:// URL" if scheme and len(scheme) < 16 and scheme.isalnum() else "something else"
        raise StorageUrlError(f"TORCHYARD_STORAGE_URL must be s3://BUCKET[/PREFIX] (e.g. {EXAMPLE}), not {found}")
    parts = urlsplit(text)
    if "@" in parts.netloc:
        raise StorageUrlError("TORCHYARD_STORAGE_URL must not carry credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                              "(or another source boto3 reads) instead")
    if parts.query or parts.fragment:
        raise StorageUrlError(f"TORCHYARD_STORAGE_URL takes no query or fragment: s3://BUCKET[/PREFIX] (e.g. {EXAMPLE})")
    bucket = parts.netloc
    if not bucket:
        raise StorageUrlError(f"TORCHYARD_STORAGE_URL names no bucket (e.g. {EXAMPLE})")
    if not _BUCKET.match(bucket) or ".." in bucket or _IP.match(bucket):
        raise StorageUrlError(f"TORCHYARD_STORAGE_URL: {bucket[:64]!r} is not a valid bucket name (3 to 63 lower-case letters, "
                              "digits, dots and hyphens, starting and ending with a letter or digit)")
    segments = [s for s in parts.path.split("/") if s]
    for segment in segments:
        if segment in (".", "..") or not _PREFIX_PART.match(segment):
            raise StorageUrlError(f"TORCHYARD_STORAGE_URL: prefix part {segment[:64]!r} is not allowed (letters, digits and "
                                  "!_.*'()=+,;@$- only; no '.' or '..')")
    prefix = "/".join(segments)
    if len(prefix) > 512:
        raise StorageUrlError("TORCHYARD_STORAGE_URL: the prefix is longer than 512 characters")
    return StorageUrl(bucket, prefix)
