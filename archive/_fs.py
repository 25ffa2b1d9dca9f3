"""Crash-safe file writes: temporary `_` name, flush, fsync, atomic rename, directory fsync."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path

TEMP_PREFIX = "_"
STALE_TEMP_AGE_S = 3600.0   # a temp file of another host (or unparsable name) older than this is stray
_HOST = socket.gethostname().replace("-", "").replace(".", "")[:32] or "host"


def fsync_dir(directory: Path) -> None:
    """Make a rename or create inside ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_name(final_name: str) -> str:
    """A temporary name that says which process on which host is writing it."""
    return f"{TEMP_PREFIX}{final_name}.{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"


def atomic_write(path: Path, write: Callable[[object], None]) -> Path:
    """Write ``path`` via a temporary sibling; ``write(fileobj)`` fills a binary file object."""
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / temp_name(path.name)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    fsync_dir(directory)
    return path


def _writer_is_gone(name: str, age_s: float) -> bool:
    """Whether the process that was writing the temp file ``name`` can no longer finish it."""
    if age_s > STALE_TEMP_AGE_S:
        return True
    try:
        host, pid_text, _ = name.rsplit(".", 2)[1].rsplit("-", 2)
        pid = int(pid_text)
    except (IndexError, ValueError):
        return False   # not one of ours and young: leave it until it is old
    if host != _HOST:
        return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def remove_stray_temps(root: Path) -> list[Path]:
    """Remove `_`-prefixed files under ``root`` whose writer died (a crash mid-write)."""
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    now = time.time()
    for path in root.rglob(f"{TEMP_PREFIX}*"):
        if not path.is_file():
            continue
        try:
            age = now - path.stat().st_mtime
        except FileNotFoundError:
            continue
        if _writer_is_gone(path.name, age):
            try:
                path.unlink()
                removed.append(path)
            except FileNotFoundError:
                pass
    for directory in {p.parent for p in removed}:
        fsync_dir(directory)
    return removed
