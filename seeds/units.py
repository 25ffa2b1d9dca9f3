"""Model-sized checks: a workload independent along some axes is checked on its full program,
its truth computed on a few units (docs/judge.md, "Model-sized workloads").

A reference file's ``UNITS`` (seeds/signature.py) names the axes its workload is independent
along: a batch row, a token, a head whose computation does not depend on its index. Past
``SLICE_ABOVE_FLOPS`` the f32 truth of the whole workload is too large for this machine (Mamba-2
at its model shape needs one 17 GB array). The judge then draws each input set from ``k`` *base
units*: every unit of every input that holds the units is a copy of one base unit, each base
used at least once, the assignment a secret permutation; the inputs that hold no unit (weights)
are drawn whole. The kernel runs on the whole set, as timed; its output is compared at *every*
position with the truth of that position's base, which is the workload on the ``k`` bases alone,
computed one base at a time. So:

* every output element is checked (a kernel wrong on one row, or that skips rows, fails);
* a kernel that mixes units (row 0's keys for every row) fails unless the two units share a base,
  which the secret assignment makes unlikely at ``k`` >= 2 and each set draws anew;
* a kernel cannot gain by knowing the rule: the timed figure is its program's on its own timing
  input, which holds no copies; computing copies once would need branches on data, which the
  figure counts on that input, so they win nothing there.

The claim of independence is the reference file's, and the judge checks it before trusting it:
on a secret draw of two units, the workload of both, sliced, must equal the workload of each
alone (``check``); a claim that fails is a ReferenceError naming the units.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence

import numpy as np

SLICE_ABOVE_FLOPS = 5e10     # a workload's FLOPs past which its truth is computed on base units
BASE_FLOPS = 1e11            # the f32 work the bases' truth may take (at least MIN_BASES of them)
MIN_BASES = 2
GROUP_BYTES = 256 << 20   # working memory the truth may add per call beyond one unit's (group_size)


def bases_for(flops: float, count: int) -> int:
    """How many base units a set of ``count`` units whose workload is ``flops`` is drawn from."""
    per_unit = max(flops / max(count, 1), 1.0)
    return int(min(count, max(MIN_BASES, math.floor(BASE_FLOPS / per_unit))))


def flatten(a: np.ndarray, axes: Sequence[int]) -> np.ndarray:
    """``a`` with its unit ``axes`` first and merged: (units, *rest)."""
    moved = np.moveaxis(a, list(axes), list(range(len(axes))))
    return moved.reshape((-1, *moved.shape[len(axes):]))


def unflatten(flat: np.ndarray, axes: Sequence[int], sizes: Sequence[int]) -> np.ndarray:
    """The inverse of ``flatten``: (units, *rest) to the unit ``axes`` of sizes ``sizes`` in place."""
    shaped = flat.reshape((*sizes, *flat.shape[1:]))
    return np.moveaxis(shaped, list(range(len(axes))), list(axes))


def assignment(rng: np.random.Generator, count: int, k: int) -> np.ndarray:
    """Each of ``count`` units' base, every one of the ``k`` bases used, in a secret order."""
    return rng.permutation(np.concatenate([np.arange(k), rng.integers(0, k, count - k)])).astype(np.int64)


def expand(bases: Sequence[np.ndarray | None], axes: Sequence[Sequence[int]], sizes: Sequence[int],
           assign: np.ndarray) -> list[np.ndarray | None]:
    """Full inputs from base ones (flattened: (k, *rest)); an input with no unit axes as it is."""
    return [b if not ax else unflatten(b[assign], ax, sizes) for b, ax in zip(bases, axes, strict=True)]


def distinct(arrays: Sequence[np.ndarray], axes: Sequence[Sequence[int]]) -> tuple[list[np.ndarray], np.ndarray]:
    """The distinct units of ``arrays`` (those with unit axes): each array's bases, flattened
    ((k, *rest), in order of first use; the others as they are), and each unit's base."""
    flat = [flatten(a, ax) if ax else None for a, ax in zip(arrays, axes, strict=True)]
    count = next(f.shape[0] for f in flat if f is not None)
    keys: dict[bytes, int] = {}
    assign = np.empty(count, np.int64)
    first: list[int] = []
    for u in range(count):
        digest = hashlib.sha256()
        for f in flat:
            if f is not None:
                digest.update(np.ascontiguousarray(f[u]).tobytes())
        key = digest.digest()
        if key not in keys:
            keys[key] = len(first)
            first.append(u)
        assign[u] = keys[key]
    picked = np.asarray(first)
    return [f[picked] if f is not None else a for f, a in zip(flat, arrays, strict=True)], assign


def some_units(flat: np.ndarray | None, whole: np.ndarray, axes: Sequence[int], u: int, n: int = 1) -> np.ndarray:
    """Base units ``u`` to ``u + n`` as the workload takes them: along its first unit axis, its
    other unit axes of size one (an input with no unit axes whole)."""
    if flat is None:
        return whole
    return unflatten(flat[u:u + n], axes, [n] + [1] * (len(axes) - 1))


def per_base(fn: Callable[..., np.ndarray], arrays: Sequence[np.ndarray], axes: Sequence[Sequence[int]],
             out_axes: Sequence[int], sizes: Sequence[int], group: int = 1) -> np.ndarray:
    """``fn`` on ``arrays`` as the model-sized check computes it: on the distinct units alone,
    ``group`` at a time (``group_size``), the output of each unit placed at every position that
    unit holds."""
    bases, assign = distinct(arrays, axes)
    count, outs = int(assign.max()) + 1, []
    for u in range(0, count, group):
        n = min(group, count - u)
        out = np.asarray(fn(*[some_units(b if ax else None, a, ax, u, n)
                              for b, a, ax in zip(bases, arrays, axes, strict=True)]))
        outs.append(flatten(out, out_axes))
    return unflatten(np.concatenate(outs)[assign], out_axes, sizes)


def group_size(extra_bytes: Callable[[int], int], count: int) -> int:
    """How many base units one call takes: as many as ``GROUP_BYTES`` of working memory beyond one
    unit's allows, read from ``extra_bytes(n)`` (the memory a call of ``n`` units needs) at one and
    two (XLA's count, which can be far below the process's peak: RetNet's truth at one row counts
    0.25 GiB, and its child peaks at 7.4 GB with two, so the budget is small). A workload whose
    memory is its weights (the MoE's 5.6 GB of f32 experts for any number of tokens) then reads
    them once per group, not once per unit."""
    if count < 2:
        return 1
    step = max(extra_bytes(2) - extra_bytes(1), 1)
    return int(min(count, max(1, GROUP_BYTES // step)))


def group_for(program: Callable, arrays: Sequence, axes: Sequence[Sequence[int]]) -> int:
    """``group_size`` for ``program`` (a JAX function) on ``arrays``, from XLA's own analysis of
    its compiled memory. JAX: for the children that compute on units, never the judge's parent."""
    import jax

    bases, assign = distinct(arrays, axes)

    def extra_bytes(n: int) -> int:
        shapes = [jax.ShapeDtypeStruct(np.shape(some_units(b if ax else None, a, ax, 0, n)), a.dtype)
                  for b, a, ax in zip(bases, arrays, axes, strict=True)]
        memory = jax.jit(program).lower(*shapes).compile().memory_analysis()
        return memory.temp_size_in_bytes + memory.output_size_in_bytes

    return group_size(extra_bytes, int(assign.max()) + 1)


def units_of(path, read: dict) -> str:
    """A reference file's model-sized check as its Task's ``units`` field (JSON: each input's and
    the output's unit axes, the units' sizes, how many bases a draw copies, whose UNITS): "" for
    a workload small enough to check whole, or that neither its file nor any built-in seed whose
    SIGNATURE its inputs fit declares UNITS for. ``read``: what the file's CPU child read."""
    import json

    from seeds._contract import BUILTIN_DIR
    from seeds.signature import SignatureError, declared_units, fits

    if read.get("model") is not None or float(read.get("flops") or 0) <= SLICE_ABOVE_FLOPS:
        return ""
    if any(i["static"] or i.get("ragged") for i in read["inputs"]):
        return ""
    specs = [(tuple(i["shape"]), i["dtype"]) for i in read["inputs"]]
    for lender in [path, *sorted(BUILTIN_DIR.glob("*/reference.py"))]:
        try:
            found = declared_units(lender)
        except (SignatureError, SyntaxError, OSError):
            continue
        orders = fits(found.params, specs) if found else []
        if not orders:
            continue
        axes = [list(found.axes(found.params[orders[0].index(i)])) for i in range(len(specs))]
        first = next(i for i, ax in enumerate(axes) if ax)
        sizes = [specs[first][0][a] for a in axes[first]]
        return json.dumps({"inputs": axes, "output": list(found.axes(found.output)), "sizes": sizes,
                           "bases": bases_for(float(read["flops"]), math.prod(sizes)),
                           "symbols": list(found.symbols), "from": str(lender)})
    return ""


def check(task, seed: int) -> None:
    """A reference Task's claim that its workload is independent along its units: on a secret
    draw (``seed``) of two units apart along each unit axis, the workload of both, sliced, equals
    the workload of each alone; ReferenceError naming the axis where it does not."""
    import dataclasses
    import json

    from seeds.entries import ReferenceError

    held = json.loads(task.units)
    for j, symbol in enumerate(held["symbols"]):
        pair = dict(held, sizes=[2 if i == j else 1 for i in range(len(held["sizes"]))], bases=2,
                    alone=True)        # each unit in a call of its own (never a group: that is the claim)
        two = dataclasses.replace(task, units=json.dumps(pair))
        inputs = two.make_inputs(seed + j, "normal")
        together = dataclasses.replace(task, units="")._workload(inputs, "truth")
        alone = two._workload(inputs, "truth")
        scale = float(np.max(np.abs(alone))) or 1.0
        worst = float(np.max(np.abs(together - alone))) / scale
        if not np.all(np.isfinite(together)) or worst > 1e-4:
            raise ReferenceError(
                f"reference file {task.path}: its workload is not independent along {symbol} (as "
                f"{held['from']} declares in UNITS): two units apart along {symbol}, together, differ from "
                f"each alone by {worst:.3g} of the output's size; a model-sized check cannot slice it")
