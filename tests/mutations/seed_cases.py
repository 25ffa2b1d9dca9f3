"""The seeds the mutation tests run on: every built-in seed, the axpy example and the reference-file
matmul with its bias and gelu in the entry (loaded by path), each at its default task and at the
small tasks it declares (``SeedTask.test_tasks``); and kernels in KernelBench's convention at their
small task (``STYLE_SEEDS``)."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from seeds import Seed, SeedTask, builtin_seeds, load_seed

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_SEEDS = (REPO / "examples" / "seed_axpy",)
# Examples run at their default task only: their files name no small task (the judge's fingerprint
# hashes examples/, so they stay as a user would write them).
EXAMPLE_DEFAULT_ONLY = (REPO / "examples" / "reference_matmul",)
# Kernels as users write them, run at their small task only: KernelBench's convention (a Model's
# forward, weights and sizes in the task file): a block tiling a reshaped input, a block tuple bound
# to a name, blocks as locals of the method with the pallas_call inline (examples/kernelbench/).
STYLE_SEEDS = tuple(REPO / "examples" / "kernelbench" / name for name in ("matmul3d", "gelu", "huber"))



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
        for label, (shape, options) in seed.task_class.test_tasks.items():
            out.append(SeedCase(seed, label, seed.task(shape, **options), source, builtin))
    for path in EXAMPLE_DEFAULT_ONLY:
        seed = load_seed(str(path))
        out.append(SeedCase(seed, "default", seed.default_task(), seed.kernel_source, False))
    for path in STYLE_SEEDS:
        seed = load_seed(str(path))
        shape, options = seed.task_class.test_tasks["small"]
        out.append(SeedCase(seed, "small", seed.task(shape, **options), seed.kernel_source, False))
    return tuple(out)


def seed_case(seed_name: str, label: str = "default") -> SeedCase:
    return next(c for c in seed_cases() if c.seed.name == seed_name and c.label == label)
