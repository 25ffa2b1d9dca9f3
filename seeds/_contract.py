"""The seed contract: what a seed directory holds, and how the rest of pallas-evolve finds it.

A seed is a directory with two files:

* ``task.py`` (trusted; never taken from a candidate) defines ``class Task(SeedTask)``, a frozen
  dataclass whose fields are one problem of the kernel (its shape, dtype, options), with what
  the judge needs: the entry point's name and static keyword arguments, the input generator, the
  f32 reference, the plain XLA program speedups are quoted against, the useful FLOPs, the
  unavoidable HBM bytes and the tolerances.
* ``kernel.py``: the starting candidate, defining the entry point.

Nothing outside a seed directory names a seed: the built-in seeds are found by name
(``seeds/<name>/``), any other by its path. ``load_seed`` checks the contract and says in one
line what is missing (a ``SeedError``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

import numpy as np


BUILTIN_DIR = Path(__file__).resolve().parent
FILES = ("task.py", "kernel.py")


# The ``wide`` input set: the timing input's draw (its public seed repeats the first set's, so a
# judge draws it with the same secret seed: the same integers, so the same work where the work
# follows the data) with its floats scaled far past the example's spread, by a factor drawn
# log-uniform in this range from the seed. A kernel whose numerics hold only near the example's
# scale (a softmax without its max subtracted overflows past a logit of 88.7) fails there.
WIDE = ("wide", 0)
WIDE_FACTORS = (100.0, 1000.0)


def wide_factor(seed: int) -> float:
    """The ``wide`` set's scale, from a stream of its own (``[seed, 3]``), so the set's other
    draws are exactly the timing input's."""
    low, high = np.log(WIDE_FACTORS)
    return float(np.exp(np.random.default_rng([seed, 3]).uniform(low, high)))


def widened(array: np.ndarray, factor: float, chunk: int = 1 << 24) -> np.ndarray:
    """A float ``array`` times ``factor``, kept finite in its own dtype: clipped to the dtype's
    largest value (float16 ends at 65504), so every input is a number the kernel could be given.
    Scaled ``chunk`` entries at a time in f32: a gigabyte of expert weights is not copied whole."""
    import ml_dtypes  # installed with jax; its finfo knows bfloat16

    largest = np.float32(ml_dtypes.finfo(array.dtype).max)
    flat, out = np.asarray(array).reshape(-1), np.empty(np.size(array), array.dtype)
    for start in range(0, flat.size, chunk):
        part = flat[start:start + chunk].astype(np.float32)
        part *= np.float32(factor)
        np.clip(part, -largest, largest, out=part)
        out[start:start + chunk] = part.astype(array.dtype)
    return out.reshape(np.shape(array))


def wide_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, factor: float) -> tuple[np.ndarray, ...]:
    """An attention draw's ``wide`` set: v scaled by ``factor``, and the logits by half of it (q
    and k each by its square root, then rounded to whole numbers): logits of standard deviation 50
    to 500, which overflow exp in f32 (past 88.7) without a running max in most rows. Whole q and
    k (below 256 here: exact in bf16, f16 and f32) make every product and partial sum of q . k
    exact in f32 for D up to 512, whatever order a kernel sums them in; what is left is one
    rounding of each scaled logit, up to half its ulp, which the task's XLA program makes (the
    truth subtracts the row max first and does not) and which moves a row whose two largest logits
    nearly tie by that much times the difference of their values. Not the whole factor: at half,
    the program's worst such error on f32 is a quarter of the f32 tolerance (B=1, H=2, N=256, ten
    draws); at the whole factor it would be half."""
    root = float(np.sqrt(factor / 2.0))
    whole = [np.rint(np.asarray(x, np.float32) * np.float32(root)).astype(np.asarray(x).dtype) for x in (q, k)]
    return (*whole, widened(v, factor))


class SeedError(ValueError):
    """A seed that cannot be found or breaks the contract; the message is one line."""


@dataclasses.dataclass(frozen=True)
class SeedTask:
    """One problem of a seed's kernel. Subclasses are frozen dataclasses with defaults for every
    field (the seed's default problem)."""

    # ---- what the kernel is ------------------------------------------------------------------
    name: ClassVar[str] = ""             # the seed's name (archive, MLflow experiment, registry)
    description: ClassVar[str] = ""      # one line: what the kernel computes
    entry: ClassVar[str] = ""            # the kernel module's entry point
    input_names: ClassVar[tuple[str, ...]] = ()
    shape_grammar: ClassVar[str] = ""    # what --shape accepts, e.g. "B=1,H=8,N=2048,D=128"
    # The chip this seed's kernels are judged for when no --chip is given (a kernel the compiler's
    # profile cannot time on one chip names another: ragged paged attention's DMAs on v5e).
    default_chip: ClassVar[str] = "v5e"
    # The timing source this seed's tasks are judged by when none is given (``--timing``; None: the
    # default, auto): a task whose XLA program has a figure only under one names it (a reference
    # file says ``TIMING = "..."``).
    timing: ClassVar[str | None] = None
    # The address space (GiB) each judged child gets when no --memory is given (0: the judge's
    # default, 12): a task whose model shape libtpu's profile needs more for names it (a reference
    # file says ``MEMORY = 16``). An upper bound, not a reservation: small shapes use what they use.
    default_memory_gib: ClassVar[int] = 0
    distributions: ClassVar[tuple[str, ...]] = ("normal",)
    # Input sets every candidate is checked on: (distribution, PRNG seed).
    correctness_inputs: ClassVar[tuple[tuple[str, int], ...]] = (("normal", 0),)
    # Outside kernels judged beside a run's champion: label -> path relative to the seed directory.
    peers: ClassVar[dict[str, str]] = {}
    # More outside kernels that `evolve ablate` shows beside those.
    ablation_peers: ClassVar[dict[str, str]] = {}
    # Kernels people already run that a search may start from instead of kernel.py (``--start
    # NAME``): short name -> an importable module's dotted name, read from the installed package at
    # run time (evolve/start/resolve.py). ``evolve seeds`` lists them.
    starts: ClassVar[dict[str, str]] = {}
    # Small problems for tests, label -> (--shape, options): quick to rewrite, small enough for the
    # judge's interpret-mode check. The seed contract suite and the operator suite run every seed at
    # "small" (which every seed must have) and at each other one.
    test_tasks: ClassVar[dict[str, tuple[str, dict[str, Any]]]] = {}

    # ---- a mesh of chips (optional) ------------------------------------------------------------
    # The chip counts a task of this seed may ask for (``--chips``); a task's ``chips`` is its mesh
    # (a seed that offers more than 1 makes it a field). A candidate uses 1 chip, or all of them by
    # setting ``CHIPS = <chips>`` in its module: its entry point is then the *per-chip* program. It
    # gets this chip's share of every input (``chip_split``) and must return the whole output on
    # every chip, combining over the mesh axis ``mesh_axis`` with JAX collectives (psum, pmax,
    # all_gather, axis_index). The judge's own harness does the ``shard_map``.
    mesh_sizes: ClassVar[tuple[int, ...]] = (1,)
    mesh_axis: ClassVar[str] = "chips"
    chips: ClassVar[int] = 1

    # ---- to be defined by the seed -----------------------------------------------------------
    @classmethod
    def from_options(cls, shape: str | None = None, **options: Any) -> SeedTask:
        """The task for a ``--shape`` string and options (``dtype``, seed-specific flags); a
        ValueError saying what is wrong otherwise."""
        raise NotImplementedError

    @property
    def key(self) -> str:
        """A stable name, ``<seed>/<problem>``, for archives and MLflow experiments."""
        raise NotImplementedError

    def input_specs(self) -> list[tuple[tuple[int, ...], str]]:
        """(shape, dtype) of each input, in the entry point's positional order."""
        raise NotImplementedError

    def kernel_kwargs(self) -> dict[str, Any]:
        """The static keyword arguments the entry point is called with."""
        return {}

    def kernel_call(self, source: str) -> tuple[str, str]:
        """What the judge runs of a kernel ``source`` and the function it calls there: the source
        itself and :attr:`entry`, unless the task calls its kernels through a function of its own
        appended to them (KernelBench's ``Model``: seeds/kernelbench.py)."""
        return source, self.entry

    def make_inputs(self, seed: int, distribution: str) -> tuple[np.ndarray, ...]:
        raise NotImplementedError

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        """The f32 ground truth, in numpy, in the trusted process."""
        raise NotImplementedError

    def reference_program(self):
        """The plain XLA program (a jax function of the inputs) speedups are quoted against."""
        raise NotImplementedError

    def check_units(self, seed: int) -> None:
        """For a task checked unit by unit (seeds/units.py): that its workload is independent along
        the units, on a secret draw (``seed``); ValueError saying which claim fails. Others: nothing."""

    def on_units(self, fn, args):
        """The task's XLA program ``fn`` on the input set ``args``, as the check runs it: whole,
        unless the task checks a model-sized workload unit by unit (seeds/units.py)."""
        return fn(*args)

    def measured_on(self, arrays: dict[str, np.ndarray]) -> SeedTask:
        """This task, its FLOPs and unavoidable bytes counted on the timing input's small integers
        (``arrays``, the judge's secret draw: e.g. a decode task's cache lengths). By default the
        work does not depend on them: the task itself."""
        return self

    def magnitude(self, *inputs: np.ndarray) -> np.ndarray | None:
        """The size of what each output element sums, same shape as the reference (attention:
        ``softmax(q k^T) @ |v|``), or None. A rounding error scales with the terms summed, not
        with their sum, which can cancel to about 0: the absolute tolerance is scaled by it where
        it exceeds 1 (``evaluator/correctness/compare.py``)."""
        return None

    def truth(self, distribution: str, *inputs: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """What the judge asks of an input set drawn from ``distribution``: the f32 truth and the
        size of what each element sums (:meth:`reference`, :meth:`magnitude`). A task may make both
        in one pass (attention: one softmax for both), or scale its tolerance on some sets only (a
        reference file's task knows no terms in general, and scales it on the ``wide`` set alone,
        where the inputs are far past the example's spread: ``seeds/reference.py``)."""
        return self.reference(*inputs), self.magnitude(*inputs)

    @property
    def flops(self) -> float:
        raise NotImplementedError

    @property
    def bytes_moved(self) -> float:
        raise NotImplementedError

    @property
    def tolerance(self) -> tuple[float, float]:
        """(atol, rtol) for the output's dtype."""
        raise NotImplementedError

    @property
    def output_dtype(self) -> str:
        return self.dtype  # type: ignore[attr-defined]  # every seed's task has a dtype field

    def chip_specs(self, chips: int) -> list[tuple[tuple[int, ...], str]]:
        """(shape, dtype) of each input as one chip of ``chips`` holds it (default: all of it)."""
        return self.input_specs()

    def chip_split(self, name: str, array: np.ndarray, chips: int) -> np.ndarray:
        """Input ``name`` as the ``chips`` chips hold it: an array of shape ``(chips, *chip_spec)``
        whose ``[c]`` is chip c's share (default: every chip holds all of it)."""
        array = np.asarray(array)
        return np.broadcast_to(array[None], (chips, *array.shape))

    # ---- given -------------------------------------------------------------------------------
    def fields(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def tiling_problem(self, tunables: dict[str, int]) -> str | None:
        """Why a kernel with these module-level tunables cannot run this problem (one line saying
        how to fix it), or None."""
        return None

    def legal_values(self, tunable: str) -> list[int] | None:
        """Legal values of a module-level tunable of the kernel at this problem, or None if the
        task does not know the tunable (operators then leave it alone)."""
        return None

    def grid_shapes(self) -> list[dict[str, int]] | None:
        """The block shapes (tunable -> value) a grid over this task's kernels tries first, e.g.
        the ablation's; None: the operator that sets the shape picks (its largest legal values)."""
        return None

    def looked_up(self, tunable: str) -> int | None:
        """The value a production module picks itself for a tunable it leaves None (a tuned
        table's entry for this problem on the seed's default chip), or None if the task does not
        know it. A first block move from such a module starts there."""
        return None

    SMALL_INPUT_BYTES = 1 << 20

    def small_inputs(self, seed: int, distribution: str) -> dict[str, np.ndarray]:
        """Inputs of at most SMALL_INPUT_BYTES, by name: what an index map may read (e.g. cache
        lengths) when the estimate's HBM traffic is counted; every small integer input must be
        among them. By default made with make_inputs; a task whose inputs are large overrides it
        to make only those."""
        arrays = zip(self.input_names, self.make_inputs(seed, distribution), strict=True)
        return {n: a for n, a in arrays if np.asarray(a).nbytes <= self.SMALL_INPUT_BYTES}

    def example_task(self, tunables: dict[str, int]) -> SeedTask | None:
        """A small float32 problem of the same kind that a kernel with these tunables accepts
        (the registered model's input example), or None for no example."""
        return None


def parse_shape(text: str, keys: dict[str, str], example: str) -> dict[str, int]:
    """Parse a ``--shape`` string such as ``B=1,H=8`` (any subset of ``keys``, which map the
    grammar's names to the task's fields) into task keyword arguments; a one-line ValueError."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        key, sep, value = part.partition("=")
        key = key.strip().upper()
        if not sep or key not in keys:
            raise ValueError(f"bad shape item {part!r}: expected KEY=VALUE with KEY in {', '.join(keys)} "
                             f"(e.g. {example})")
        try:
            number = int(value)
        except ValueError:
            raise ValueError(f"bad shape item {part!r}: {value!r} is not an integer") from None
        if number <= 0:
            raise ValueError(f"bad shape item {part!r}: {key} must be positive")
        out[keys[key]] = number
    return out


def check_positive_ints(task: SeedTask, names: tuple[str, ...]) -> None:
    """For a task's ``__post_init__``: each named field a positive int (a bool is not one)."""
    for name in names:
        value = getattr(task, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Seed:
    """A seed directory that meets the contract."""

    name: str
    directory: Path
    task_class: type[SeedTask]

    @property
    def kernel_path(self) -> Path:
        return self.directory / "kernel.py"

    @property
    def kernel_source(self) -> str:
        return self.kernel_path.read_text()

    @property
    def description(self) -> str:
        return self.task_class.description

    def default_task(self) -> SeedTask:
        return self.task_class()

    def task(self, shape: str | None = None, **options: Any) -> SeedTask:
        return self.task_class.from_options(shape, **options)

    def peer_paths(self, ablation: bool = False) -> dict[str, Path]:
        cls = self.task_class
        peers = {**cls.ablation_peers, **cls.peers} if ablation else cls.peers
        return {label: (self.directory / rel).resolve() for label, rel in peers.items()}
