"""The inputs a candidate is checked on: secret draws that no candidate can know.

A kernel that knows its correctness inputs can carry their answers instead of computing them
(outputs keyed to known inputs, the classic reward hack of kernel benchmarks). So every judge
draws its own PRNG seeds from the operating system's randomness (``secrets``) when it makes its
ground truth, one per input set of the task (``SeedTask.correctness_inputs`` names the
distributions; their seeds there are public and serve only for a judge given explicit sets). The
seeds and the arrays stay in trusted processes: the judge, the trusted runner that runs the
interpreter on them, and a node that judges for this judge (it is sent the arrays). The jailed
worker never sees an input, a seed or a value derived from one, and a set's label (which error
messages and the archive carry) names its distribution, never its seed.

What stays public, and why that is safe:

* **The timing input's integers** (the decode task's cache lengths): the HBM traffic model reads
  them, and the figure must be the same whatever the draw. They are the small integer inputs of
  the task's first correctness set, made with its public seed (``timing_input``); the first secret
  set uses them with secret values, so the input the figure is of is also checked for correctness.
* **The figures**: the compiler's estimate reads no input, so a kernel re-judged gets the same
  figure from every draw.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Sequence

import numpy as np

from seeds import SeedTask


@dataclasses.dataclass(frozen=True)
class GroundTruth:
    """One input set, the f32 truth on it, and what the task's own XLA program gives on it."""

    label: str
    inputs: tuple
    f32: np.ndarray
    program_out: np.ndarray | None = None


def set_counts(task: SeedTask, explicit: Sequence[tuple[str, int]] | None = None) -> tuple[int, int]:
    """(input sets a candidate of ``task`` is checked on, how many of them are secret draws)."""
    sets = len(explicit or task.correctness_inputs)
    return sets, 0 if explicit else sets


def timing_input(task: SeedTask, explicit: Sequence[tuple[str, int]] | None = None) -> dict[str, np.ndarray]:
    """The public timing input: the small integer inputs (e.g. cache lengths) of the task's first
    correctness set, made with its public seed; what the HBM model's index maps are evaluated on."""
    dist, seed = (explicit or task.correctness_inputs)[0]
    return {name: np.asarray(a) for name, a in task.small_inputs(seed, dist).items()
            if np.issubdtype(np.asarray(a).dtype, np.integer)}


def draw(task: SeedTask, explicit: Sequence[tuple[str, int]] | None = None) -> list[tuple[str, tuple]]:
    """The input sets of one judge, (label, arrays) each: fresh secret draws, one per distribution of
    the task's sets; ``explicit`` ((distribution, seed) pairs) gives public sets instead (for a user
    who wants to reproduce a failure; such a judge's verdicts record 0 secret sets)."""
    if explicit:
        return [(f"input {dist} seed {seed}", tuple(task.make_inputs(seed, dist))) for dist, seed in explicit]
    public = timing_input(task)
    sets = []
    for i, (dist, _) in enumerate(task.correctness_inputs):
        arrays = list(task.make_inputs(secrets.randbits(63), dist))
        label = f"input set {i + 1} ({dist}, secret draw)"
        if i == 0 and public:
            for j, name in enumerate(task.input_names):
                if name in public:
                    arrays[j] = public[name].astype(np.asarray(arrays[j]).dtype)
            label = f"input set 1 ({dist}, secret values, the public timing input's {', '.join(public)})"
        sets.append((label, tuple(arrays)))
    return sets
