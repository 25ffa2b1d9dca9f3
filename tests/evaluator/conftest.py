"""Shared fixtures: tiny tasks, kernel variants of the seed (the session's judge: tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from seeds.flash_attention.task import AttentionTask

SEED_PATH = Path(__file__).resolve().parents[2] / "seeds" / "flash_attention" / "kernel.py"
KERNELS = Path(__file__).resolve().parent / "kernels"
TINY = AttentionTask(batch=1, heads=2, seq_len=256, head_dim=128, causal=True)
TINY_FULL = AttentionTask(batch=1, heads=2, seq_len=256, head_dim=128, causal=False)


@pytest.fixture(scope="session")
def seed_source() -> str:
    return SEED_PATH.read_text()


def variant(seed_source: str, old: str, new: str, count: int = 1) -> str:
    """The seed with ``old`` replaced by ``new`` (which must be present ``count`` times)."""
    assert seed_source.count(old) == count, f"{old!r} occurs {seed_source.count(old)} times"
    return seed_source.replace(old, new)
