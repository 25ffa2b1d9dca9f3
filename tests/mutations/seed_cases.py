"""The seeds the mutation tests run on: every built-in seed and the axpy example (loaded by path),
each at its default task and at the small tasks below."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from seeds import Seed, SeedTask, builtin_seeds, load_seed

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_SEEDS = (REPO / "examples" / "seed_axpy",)

# Small problems of each seed, label -> (shape, options): quick to rewrite, and small enough for
# the judge's interpret-mode check. A new built-in seed needs an entry (test_every_seed_has_a_small_task).
SMALL_TASKS: dict[str, dict[str, tuple[str, dict]]] = {
    "flash_attention": {"small": ("B=1,H=2,N=256,D=128", {}),
                        "small-full": ("B=1,H=2,N=256,D=128", {"causal": False})},
    # GQA (H=4 over HKV=2), so that grouped_heads applies. At N=1024 libtpu's static profiler aborts.
    "flash_decoding": {"small": ("B=2,H=4,HKV=2,N=2048,D=128,T=1", {}),
                       # a v5e 2x2 (chip_split applies); each chip's share long enough for the profiler
                       "small-4chips": ("B=2,H=4,HKV=2,N=8192,D=128,T=1", {"chips": 4})},
    "axpy": {"small": ("M=64,N=256", {})},
}


@dataclasses.dataclass(frozen=True)
class SeedCase:
    """One seed at one task, with its starting kernel's text."""

    seed: Seed
    label: str
    task: SeedTask
    source: str
    builtin: bool

    @property
    def id(self) -> str:
        return f"{self.seed.name}-{self.label}"

    def __repr__(self) -> str:   # what pytest shows for a parameter
        return self.id


@functools.cache
def seeds() -> tuple[tuple[Seed, bool], ...]:
    """(seed, built-in?) for every built-in seed and every example seed."""
    return (*((load_seed(name), True) for name in builtin_seeds()),
            *((load_seed(str(path)), False) for path in EXAMPLE_SEEDS))


@functools.cache
def seed_cases() -> tuple[SeedCase, ...]:
    out = []
    for seed, builtin in seeds():
        source = seed.kernel_source
        out.append(SeedCase(seed, "default", seed.default_task(), source, builtin))
        for label, (shape, options) in SMALL_TASKS.get(seed.name, {}).items():
            out.append(SeedCase(seed, label, seed.task(shape, **options), source, builtin))
    return tuple(out)


def seed_case(seed_name: str, label: str = "default") -> SeedCase:
    return next(c for c in seed_cases() if c.seed.name == seed_name and c.label == label)
