"""What names object storage rather than a local path: the one test every layer shares."""

from __future__ import annotations

from typing import Any


def is_url(path: Any) -> bool:
    """Whether ``path`` names object storage (``s3://…``, ``gs://…``, ``file://…``)."""
    return isinstance(path, str) and "://" in path
