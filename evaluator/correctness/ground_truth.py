"""The inputs a candidate is checked on: secret draws that no candidate can know.

A kernel that knows its correctness inputs can carry their answers instead of computing them
(outputs keyed to known inputs, the classic reward hack of kernel benchmarks). So every judge
draws its own PRNG seeds from the operating system's randomness (``secrets``) when it makes its
ground truth, one per input set of the task (``SeedTask.correctness_inputs`` names the
distributions; their seeds there are public and serve only for a judge given explicit sets). The
seeds and the arrays stay in trusted processes: the judge, the trusted runner that runs the
interpreter on them, and a node that judges for this judge (it is sent the arrays). The jailed
worker never sees an input, a seed or a value derived from one, and a set's label (which error
messages and the archive carry) names its distribution, never its seed. A set whose public seed
repeats an earlier set's is drawn with that set's secret seed too: the ``wide`` set repeats the
first's (``seeds._contract.WIDE``), so it is the timing input again with its floats scaled 100 to
1000 times past the example's spread, and its integers (cache lengths, group sizes) are the
timing input's: it checks the numerics far from the example's scale without adding a draw of
work that a figure following the data would count (the figure is the slowest set's).

The timing input is the first input set, a secret draw like the others: its small integers
(the decode task's cache lengths) are what the HBM traffic model's index maps and the counted
loops and branches (``trips.py``) are evaluated on, so the figure is of the data the kernel was
also checked on, and no kernel can recognise it (a kernel that did less work on a known timing
input than on others like it would be timed on its cheap path). A judge draws it once per task:
every candidate of one run is timed on the same lengths, and a figure that depends on the lengths
moves between judges by as much as the work does (the README gives the spread). A kernel whose
work does not depend on its data gets the same figure from every draw.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from seeds import SeedTask


class Drawn(NamedTuple):
    """One input set as drawn: its label, its arrays, and the distribution it was drawn from (what
    ``SeedTask.truth`` is asked about; never in a label with its seed)."""

    label: str
    inputs: tuple
    distribution: str


@dataclasses.dataclass(frozen=True)
class GroundTruth:
    """One input set, the f32 truth on it, and what the task's own XLA program gives on it."""

    label: str
    inputs: tuple
    f32: np.ndarray
    program_out: np.ndarray | None = None
    magnitude: np.ndarray | None = None    # the task's SeedTask.magnitude on the same inputs
    # The task's XLA program's f32 dots the TPU computes in one bf16 pass (precision.py): the
    # precision of the plain work on the chip, which sets the tolerance (verdicts.tolerance).
    program_reduced_dots: tuple[str, ...] = ()


def set_counts(task: SeedTask, explicit: Sequence[tuple[str, int]] | None = None) -> tuple[int, int]:
    """(input sets a candidate of ``task`` is checked on, how many of them are secret draws)."""
    sets = len(explicit or task.correctness_inputs)
    return sets, 0 if explicit else sets


def timing_seed(explicit: Sequence[tuple[str, int]] | None = None) -> int:
    """The seed of the timing input (the first input set): a secret draw, or the first explicit set's."""
    return explicit[0][1] if explicit else secrets.randbits(63)


def timing_distribution(task: SeedTask, explicit: Sequence[tuple[str, int]] | None = None) -> str:
    """The distribution the timing input (the first input set) is drawn from."""
    return (explicit or task.correctness_inputs)[0][0]


def timing_input(task: SeedTask, seed: int, explicit: Sequence[tuple[str, int]] | None = None
                 ) -> dict[str, np.ndarray]:
    """The timing input's small integer inputs (e.g. cache lengths), made with ``seed`` (see
    :func:`timing_seed`): what the HBM model's index maps and the counted trips are evaluated on."""
    return {name: np.asarray(a) for name, a in task.small_inputs(seed, timing_distribution(task, explicit)).items()
            if np.issubdtype(np.asarray(a).dtype, np.integer)}


def draw(task: SeedTask, explicit: Sequence[tuple[str, int]] | None = None,
         first_seed: int | None = None, keep: Callable[[Drawn], Drawn] = lambda d: d) -> list[Drawn]:
    """The input sets of one judge: fresh secret draws, one per distribution of the task's sets, the
    first made with ``first_seed`` (the timing input's, :func:`timing_seed`), a set whose public
    seed repeats an earlier one's with that one's secret seed; ``explicit`` ((distribution, seed)
    pairs) gives public sets instead (for a user who wants to reproduce a failure; such a judge's
    verdicts record 0 secret sets). ``keep`` is given each set as it is made (what the caller
    keeps of it: a model-sized set goes to a file before the next is drawn)."""
    if explicit:
        return [keep(Drawn(f"input {dist} seed {seed}", tuple(task.make_inputs(seed, dist)), dist))
                for dist, seed in explicit]
    sets, secret = [], {}
    for i, (dist, public) in enumerate(task.correctness_inputs):
        if public not in secret:
            secret[public] = first_seed if i == 0 and first_seed is not None else secrets.randbits(63)
        label = f"input set {i + 1} ({dist}, secret draw{'; the timing input' if i == 0 else ''})"
        sets.append(keep(Drawn(label, tuple(task.make_inputs(secret[public], dist)), dist)))
    return sets


def truth_of(task: SeedTask, drawn: Drawn) -> GroundTruth:
    """A drawn set with its f32 truth and the size of what each element sums (``SeedTask.truth``,
    asked with the set's distribution); the task's XLA program's output is added once it has run."""
    f32, size = task.truth(drawn.distribution, *drawn.inputs)
    return GroundTruth(drawn.label, drawn.inputs, f32, magnitude=size)
