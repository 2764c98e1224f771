"""How to reach object storage through fsspec (S3 with s3fs; GCS, Azure and others the same
way), where to cache what is read from it, and its failures as packdata errors.

Reading a dataset at a URL is :mod:`packdata.remote.shards`, input files at a URL
:mod:`packdata.remote.files`, writing :mod:`packdata.conversion.upload`.

Credentials come from where the storage library looks (environment, profile files, instance
metadata) or from ``storage_options``; packdata keeps none of its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packdata.errors import ArgumentError, DatasetError, PackdataError, require
from packdata.units import parse_bytes

#: default bound on the bytes of cached shards in one cache directory
CACHE_LIMIT = 10 << 30
#: botocore settings so that an unreachable endpoint fails in seconds, not minutes
S3_DEFAULTS = {"config_kwargs": {"connect_timeout": 5, "read_timeout": 60,
                                 "retries": {"max_attempts": 2}}}
ACCESS = ("shards", "ranges")
CREDENTIAL_PLACES = (
    "storage_options (key=, secret= or profile=), the environment (AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE), the shared files ~/.aws/credentials and "
    "~/.aws/config (or AWS_SHARED_CREDENTIALS_FILE / AWS_CONFIG_FILE), and the instance or "
    "container metadata service"
)


@dataclass
class Storage:
    """How to reach object storage and where to cache what is read from it."""

    storage_options: dict[str, Any] = field(default_factory=dict)
    cache_dir: str | Path | None = None
    cache_limit: int | str = CACHE_LIMIT
    prefetch: int = 2  # shards fetched ahead of the one being read
    #: "shards": whole shards fetched into the cache (streaming, epochs over the dataset);
    #: "ranges": each batch's records fetched by ranged GETs of their members (map-style access
    #: to a few records of a large dataset, nothing cached but the index)
    access: str = "shards"

    def __post_init__(self) -> None:
        if self.access not in ACCESS:
            raise ArgumentError(f"access '{self.access}': expected one of {', '.join(ACCESS)}")
        parse_bytes(self.cache_limit)  # refused now, not at the first shard cached

    def filesystem(self, url: str) -> tuple[Any, str]:
        """The fsspec filesystem for ``url`` and the path within it."""
        fsspec = require("fsspec", "cloud", f"reading or writing {url}")
        protocol = url.split("://", 1)[0]
        options = dict(self.storage_options or {})
        if protocol in ("s3", "s3a"):
            require("s3fs", "cloud", f"reading or writing {url}")
            options = {**S3_DEFAULTS, **options}
        with errors(url):
            fs, path = fsspec.core.url_to_fs(url, **options)
        return fs, path.rstrip("/")

    def local_dir(self, url: str) -> Path:
        """This URL's cache directory."""
        # the platform's cache folder, and a name no script run from there imports as packdata
        base = Path(self.cache_dir) if self.cache_dir else Path(
            os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "packdata-cache"
        return base / hashlib.sha1(url.rstrip("/").encode()).hexdigest()[:16]


@contextlib.contextmanager
def errors(url: str):
    """Storage-library failures as packdata errors that say what to do."""
    try:
        yield
    except PackdataError:
        raise
    except Exception as exc:
        names = {c.__name__ for c in type(exc).__mro__}
        text = str(exc)
        if "NoSuchBucket" in text or "bucket does not exist" in text.lower():
            raise DatasetError(f"{url}: no such bucket") from None
        if isinstance(exc, FileNotFoundError):
            raise DatasetError(f"{url}: not found ({exc})") from None
        if "NoCredentialsError" in names or "Unable to locate credentials" in text:
            raise PackdataError(f"{url}: no credentials found; looked in {CREDENTIAL_PLACES}") \
                from None
        if isinstance(exc, PermissionError):
            raise PackdataError(f"{url}: access denied ({text}); check the credentials found in "
                                f"{CREDENTIAL_PLACES}") from None
        if isinstance(exc, (OSError, TimeoutError)) or "EndpointConnectionError" in names \
                or "ConnectTimeoutError" in names:
            raise PackdataError(f"cannot reach {url} ({exc.__class__.__name__}: {text}); is the "
                                "endpoint right and reachable?") from None
        raise
