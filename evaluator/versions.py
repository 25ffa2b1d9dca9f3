"""The versions every figure is recorded with (read from package metadata: nothing is loaded)."""

from __future__ import annotations

import functools
from importlib import metadata


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def versions() -> dict[str, str | None]:
    return {"jax_version": _version("jax"), "jaxlib_version": _version("jaxlib"),
            "libtpu_version": _version("libtpu") or _version("libtpu-nightly")}
