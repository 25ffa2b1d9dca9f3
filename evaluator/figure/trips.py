"""Loops and branches that depend on data, counted on the data the figure is of.

libtpu's static estimate cannot know how often a loop bounded by a value in memory runs, nor which
way a branch on such a value goes: it guesses (some 30-40 trips, whatever the real count; the
README's table). The judge knows the timing input, so it counts instead:

1. **Sites** (``counting.py``). A *site* is a ``while`` whose condition, or a ``cond`` whose index,
   depends on what the kernel reads from memory (any operand: scalar prefetch, blocks, scratch), or
   on the carry of a site loop (in a variant that loop runs made-up trips, so an inner loop bounded
   by its induction variable would be simulated on them); a loop or branch on ``program_id`` or
   constants is not one. :func:`sites` finds them by the same walk on the kernel's own jaxpr (refs)
   and on the discharged one the interpreter runs (values), so both agree on their order; if they
   do not, nothing is counted.
2. **Counts** (``counting.py``). The trusted runner checks every input set with
   :func:`counting_program`: the same interpreted program (``interpret.grid_loop``), which also
   carries, per site, how often it was entered, how many trips each ``while`` ran and the sum of
   their squares per entry (whether the entries ran the same trips), or how often each arm of a
   ``cond`` was taken, summed over the grid. The outputs are the kernel's, bit for bit, and are
   checked like any other.
3. **Variants.** ``variants.retrace`` rewrites each kernel's sites into static code the estimate
   *can* count: a ``while`` into a loop of k trips (``fori_loop`` with a constant bound), a ``cond``
   into one of its arms. :func:`plan` picks the variants: the base (every loop at the floor of its
   mean trips per entry, at least one; every branch at its most-taken arm), plus one variant per
   site that moves it by one trip or to another arm taken on the data, and one per set of such
   moves on sites nested one in another (:func:`chains`).
4. **The figure** is multilinear in the sites' means: the base's estimate plus each variant's
   mixed difference (inclusion-exclusion over its sub-chains), times the product of its moves'
   distances from the base (:func:`combine`). It is exact where the estimate is linear in each
   site's trips given the sites around it; where it leans on that (a loop whose trips differ
   between entries, or are extrapolated past the variants), the loop is also compiled at two trips
   over its base, and a second difference over ``LINEAR_TOLERANCE`` of the first refuses the
   figure, naming the loop (:func:`figure`). A loop whose trips are the same everywhere, at most
   ``MAX_TRIPS``, needs only the base compile. The runner makes a figure per input set; the
   estimate's is the slowest (``timing/compiler_estimate.py``).

Variants are compiled, never run: their values are not the kernel's. Everything here runs in the
trusted runner, on the jaxpr it rebuilt from data; the candidate never sees a count.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import jax.numpy as jnp
from jax._src import core as jcore

from evaluator.correctness.interpret import grid_loop
from evaluator.figure import dmas, dynamic_grid
from evaluator.figure.counting import Counter, Site, same_sites, sites
from evaluator.figure.variants import Uncountable, retrace, retrace_kernel
from evaluator.program.jaxpr_tools import bind, call_body, environment, find

# ---- the plan and the figure -----------------------------------------------------------------
# The most trips a variant gives a loop; a loop of more is extrapolated from this and one more.
MAX_TRIPS = 4
# The most variants one figure may compile (nested sites multiply them); beyond, it is refused.
MAX_VARIANTS = 48
# How far from linear in a loop's trips the estimate may be (its second difference against its
# first) before the figure, which assumes it, is refused.
LINEAR_TOLERANCE = 0.05


@dataclasses.dataclass(frozen=True)
class SiteCount:
    """What one site did on the timing input, summed over the grid."""

    kernel: int
    site: Site
    counts: tuple[int, ...]    # (entries, trips, squared trips per entry) or (taken per arm)

    @property
    def entries(self) -> int:
        return self.counts[0] if self.site.kind == "while" else sum(self.counts)

    @property
    def mean(self) -> float:
        """Trips per entry (a while), or the share of entries taking each arm is :meth:`share`."""
        return self.counts[1] / self.entries if self.entries else 0.0

    @property
    def uniform(self) -> bool:
        """Every entry of a while ran the same trips (its variance is 0); a cond: always."""
        if self.site.kind != "while":
            return True
        entries, total, squares = self.counts
        return entries * squares == total * total

    def share(self, arm: int) -> float:
        return self.counts[arm] / self.entries if self.entries else 0.0

    @property
    def base(self) -> int:
        """The base variant's choice: the floor of the mean trips, at least one (a loop of none
        leaves a DMA it starts for a later wait unstarted, and libtpu's profiler refuses such a
        program, "No DMA issue node found") and at most MAX_TRIPS (libtpu 0.0.42.1 crashes
        profiling ragged paged attention's sequence loop at 32 static trips; at 2, 8 and 16 its
        estimate is linear in the trips, 76,304 cycles each, and one at 9 trips needs 6.4 GB); or
        the most-taken arm."""
        if self.site.kind == "while":
            return max(1, min(MAX_TRIPS, math.floor(self.mean)))
        return max(range(len(self.counts)), key=lambda k: (self.counts[k], -k))

    def moves(self) -> list[tuple[int, float]]:
        """(another choice, its weight): the variants beside the base this site needs (a loop of
        under one or over MAX_TRIPS trips per entry on average is extrapolated from the base and
        one more)."""
        if self.site.kind == "while":
            frac = self.mean - self.base
            return [(self.base + 1, frac)] if abs(frac) > 1e-9 else []
        if self.site.dma:
            # A branch that starts a DMA waited for elsewhere (a prefetch, as in ragged paged
            # attention's double buffering) is held at its most-taken arm in every variant:
            # another arm would leave a wait without its start, which libtpu's profiler aborts
            # on. The bytes its copies move are counted exactly (dmas.py); only the issue of the
            # copies and what else the arm does are not weighed.
            return []
        return [(k, self.share(k)) for k in range(len(self.counts)) if k != self.base and self.counts[k]]

    @property
    def linear_check(self) -> bool:
        """Whether the figure leans on the estimate being linear in this loop's trips: its trips
        differ between entries (the mean stands for all of them), or they are extrapolated."""
        if self.site.kind != "while" or not self.entries:
            return False
        return not self.uniform or any(not 0 <= w <= 1 for _, w in self.moves())

    @property
    def key(self) -> tuple:
        return (self.kernel, self.site.path)


def _inside(outer: SiteCount, inner: SiteCount) -> bool:
    return outer.kernel == inner.kernel and inner.site.path[:len(outer.site.path)] == outer.site.path \
        and inner.site.path != outer.site.path


def chains(counted: list[SiteCount]) -> list[tuple[tuple[SiteCount, int, float], ...]]:
    """Every set of moves whose sites nest one inside the next (a site with one of its moves, then
    a site inside it with one of its own, ...). The estimate is taken as linear in each site's
    mean trips or arm shares *given* the sites around it, so the figure is multilinear in them:
    the variants of these sets, and no others, determine it exactly."""
    out: list[tuple] = []

    def extend(chain: tuple, rest: list[SiteCount]) -> None:
        for k, c in enumerate(rest):
            if chain and not _inside(chain[-1][0], c):
                continue
            for choice, weight in c.moves():
                longer = chain + ((c, choice, weight),)
                out.append(longer)
                extend(longer, rest[k + 1:])

    ordered = sorted(counted, key=lambda c: (c.kernel, len(c.site.path), c.site.path))
    extend((), ordered)
    return out


def plan(counted: list[SiteCount], fixed: dict | None = None) -> tuple[dict, list[tuple[dict, float]]]:
    """The base choice ({(kernel, path): choice}) and the variants beside it, each with its weight
    (the product of its moves' weights) and the sets of moves it is made of; ``fixed`` (dynamic
    grids at their sizes, ``dynamic_grid.py``) is in every one."""
    base = dict(fixed or {}) | {c.key: c.base for c in counted}
    return base, [(base | {c.key: choice for c, choice, _ in chain}, math.prod(w for _, _, w in chain))
                  for chain in chains(counted)]


def combine(base_cycles: int, variant_cycles: list[tuple[int, float]], nested: list[tuple[int, ...]] | None = None
            ) -> int:
    """The base's estimate plus each variant's mixed difference, weighted. ``nested[i]`` lists the
    variants that are variant i's sub-chains (none for a single move): the mixed difference of a
    chain of moves is the inclusion-exclusion sum over its sub-chains, so that a site inside
    another is weighed by its own mean and its host's, not by either alone."""
    nested = nested or [() for _ in variant_cycles]
    diffs: dict[int, float] = {}
    for i in sorted(range(len(variant_cycles)), key=lambda i: len(nested[i])):    # sub-chains first
        diffs[i] = variant_cycles[i][0] - base_cycles - sum(diffs[j] for j in nested[i])
    return max(0, round(base_cycles + sum(diffs[i] * w for i, (_, w) in enumerate(variant_cycles))))


def _sub_chains(all_chains: list[tuple]) -> list[tuple[int, ...]]:
    """For each chain, the indices of its proper, non-empty sub-chains (earlier in the list)."""
    index = {tuple((c.key, choice) for c, choice, _ in ch): i for i, ch in enumerate(all_chains)}
    out = []
    for ch in all_chains:
        moves = [(c.key, choice) for c, choice, _ in ch]
        subs = []
        for r in range(1, len(moves)):
            for pick in itertools.combinations(moves, r):
                subs.append(index[tuple(pick)])
        out.append(tuple(subs))
    return out


def describe(counted: list[SiteCount]) -> list[dict]:
    return [{"kernel": c.kernel, "kind": c.site.kind, "path": list(c.site.path),
             "counts": list(c.counts), "entries": c.entries,
             **({"mean_trips": round(c.mean, 4), "uniform": c.uniform} if c.site.kind == "while" else {})}
            for c in counted]


__all__ = ["Counter", "Site", "SiteCount", "Uncountable", "chains", "combine", "counting_program", "describe", "figure",
           "kernel_sites", "plan", "same_sites", "site_counts", "sites", "variant_program"]


# ---- the programs ----------------------------------------------------------------------------
def _outer_eval(jaxpr: jcore.Jaxpr, consts, args, on_kernel) -> list:
    """Evaluate the program around the kernels; every ``pallas_call`` (also inside jit and
    custom_jvp/vjp calls) is ``on_kernel(eqn, inputs)``, in program order."""
    env, read = environment(jaxpr, consts, args)
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        if eqn.primitive.name == "pallas_call":
            outs = on_kernel(eqn, ins)
        elif (call := call_body(eqn)) is not None and _holds_kernel(call[0]):
            sub, sub_consts = call
            outs = _outer_eval(sub, sub_consts, ins, on_kernel)
        else:
            outs = bind(eqn, ins)
        for v, x in zip(eqn.outvars, outs, strict=True):
            env[v] = x
    return [read(v) for v in jaxpr.outvars]


def _holds_kernel(jaxpr: jcore.Jaxpr) -> bool:
    return bool(find(jaxpr, lambda e: e.primitive.name == "pallas_call"))


def kernel_sites(closed) -> list[list[Site]]:
    """The sites of each kernel of a program, in program order (``[]`` per kernel without)."""
    found: list[list[Site]] = []

    def visit(eqn, ins):
        found.append(sites(eqn.params["jaxpr"]))
        return [jnp.zeros(v.aval.shape, v.aval.dtype) for v in eqn.outvars]

    import jax

    jax.make_jaxpr(lambda *xs: _outer_eval(closed.jaxpr, closed.consts, xs, visit))(
        *[jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in closed.jaxpr.invars])
    return found


def _counting(jaxpr, grid_mapping, kernel, kernel_consts):
    """The interpreter's counting hook (``interpret.grid_loop``): the discharged kernel, with a
    marker after each DMA start and wait (``dmas.py``), its sites and the counter for them."""
    from jax._src.pallas import hlo_interpreter as hlo

    copies = dmas.dmas(jaxpr)
    if copies:     # a marker after each DMA start and wait, counted as the run passes it
        marked = retrace(jaxpr, grid_mapping, {}, {d.path: i for i, d in enumerate(copies)})
        kernel, kernel_consts, _ = hlo.kernel_to_hlo_jaxpr(marked, (), grid_mapping)
    found = sites(kernel)
    if not same_sites(sites(jaxpr), found):
        raise Uncountable("the kernel's loops and branches on data do not match the interpreted kernel's")
    counter = Counter(found, dmas.marks(kernel))
    if len(counter.offset) != len(found) + len(copies):
        raise Uncountable("a DMA of the kernel has no marker in the interpreted kernel")
    return kernel, kernel_consts, counter, (found, copies)


def counting_program(closed):
    """The interpreted program (``interpret.grid_loop``) that also returns every kernel's counts:
    ``fn(*inputs) -> (outputs, [counts per kernel])``; the sites are in ``fn.sites`` once traced."""
    single = len(closed.jaxpr.outvars) == 1

    def program(*xs):
        counts, program.sites, program.dmas, program.grids, program.prefetch = [], [], [], [], []

        def run(eqn, ins):
            outs, c, (found, kernel_dmas) = grid_loop(*ins, count=_counting, **eqn.params)
            program.sites.append(found)
            program.dmas.append(kernel_dmas)
            program.grids.append(dynamic_grid.count(eqn))
            program.prefetch.append(dynamic_grid.prefetch_shapes(eqn))
            counts.append(dynamic_grid.with_data(c, eqn, ins))
            return outs

        outs = _outer_eval(closed.jaxpr, closed.consts, xs, run)
        return (outs[0] if single else tuple(outs)), counts

    program.sites, program.dmas, program.grids, program.prefetch = [], [], [], []
    return program


def variant_program(closed, choice: dict[tuple, int]):
    """The TPU program with every kernel's sites fixed: ``choice`` maps (kernel index, site path)
    to trips or arm. Returns a function of the program's inputs (to export and compile)."""
    single = len(closed.jaxpr.outvars) == 1

    def program(*xs):
        seen, sizes_made = [0], []

        def run(eqn, ins):
            k = seen[0]
            seen[0] += 1
            mine = {path: c for (kernel, path), c in choice.items() if kernel == k and path[0] != dynamic_grid.GRID}
            sizes = {path[1]: c for (kernel, path), c in choice.items() if kernel == k and path[0] == dynamic_grid.GRID}
            if sizes:       # the ops that work a dynamic grid's size out are kept (an output), and counted
                sizes_made.extend(ins[:dynamic_grid.count(eqn)])
                eqn, ins = dynamic_grid.static(eqn, ins, sizes)
            fixed = retrace_kernel(eqn, mine) if mine else eqn
            return bind(fixed, ins)

        outs = _outer_eval(closed.jaxpr, closed.consts, xs, run)
        if sizes_made:
            return (*outs, *sizes_made)
        return outs[0] if single else tuple(outs)

    return program


def site_counts(found: list[list[Site]], counts: list) -> list[SiteCount]:
    """Every kernel's counts vector cut into its sites' counts."""
    out = []
    for k, (kernel_sites_, vector) in enumerate(zip(found, counts, strict=True)):
        values = [int(x) for x in vector][:sum(s.width for s in kernel_sites_)]
        offset = 0
        for s in kernel_sites_:
            out.append(SiteCount(k, s, tuple(values[offset:offset + s.width])))
            offset += s.width
    return out


def dma_starts(found: list[list[Site]], counts: list) -> list[list[int]]:
    """Each kernel's DMA start and wait counts (``dmas.dmas``' order): its count vector past its
    sites' counters."""
    return [[int(x) for x in vector][sum(s.width for s in kernel_sites_):]
            for kernel_sites_, vector in zip(found, counts, strict=True)]


def figure(found: list[list[Site]], counts: list, estimate, fixed: dict | None = None) -> dict:
    """The counted figure: ``estimate(choice) -> cycles`` compiles one variant and reads its estimate
    (the same choice may be asked for twice: ``count_figures`` compiles it once). Returns the
    stage's facts: cycles, the sites' counts and every variant's figure. Raises
    :class:`Uncountable` where the figure would rest on a linearity the estimate does not have
    (a loop whose trips differ between entries, or are extrapolated, and whose estimate's second
    difference in its trips is not ~0), naming the loop."""
    counted = site_counts(found, counts)
    base, variants = plan(counted, fixed)
    checks = [c for c in counted if c.linear_check]
    if len(variants) + 2 * len(checks) > MAX_VARIANTS:
        raise Uncountable(f"{len(variants)} variants for {len(counted)} nested loops and branches on data: "
                          f"more than the {MAX_VARIANTS} a figure may compile")
    base_cycles = estimate(base)
    moved = [(estimate(choice), weight) for choice, weight in variants]
    linear = []
    for c in checks:     # the loop at base, base + 1 and base + 2 trips: a straight line, or refused
        c0, c1, c2 = base_cycles, estimate(base | {c.key: c.base + 1}), estimate(base | {c.key: c.base + 2})
        first, second = c1 - c0, c2 - 2 * c1 + c0
        linear.append({"kernel": c.kernel, "path": list(c.site.path), "cycles": [c0, c1, c2]})
        if abs(second) > LINEAR_TOLERANCE * max(abs(first), 1):
            raise Uncountable(
                f"{c.site.named(c.kernel)} runs {c.counts[1]} trips over {c.entries} entries, unevenly or beyond "
                f"what a variant compiles, and the estimate is not linear in its trips ({c.base}, {c.base + 1}, "
                f"{c.base + 2} trips: {c0}, {c1}, {c2} cycles), so its mean does not stand for them: "
                "write its trips as a constant or make them the same in every grid entry")
    cycles = combine(base_cycles, moved, _sub_chains(chains(counted)))
    return {"cycles": cycles, "base_cycles": base_cycles, "sites": describe(counted),
            "variants": [{"cycles": c, "weight": round(w, 6)} for c, w in moved], "linear_checks": linear}


def count_figures(closed, counting, counted_sets: list, llo, compile_variant) -> dict:
    """The figure of a kernel whose work depends on its data, counted on every input set (the
    trusted runner's): loops and branches by static variants, each compiled for the chip by
    ``compile_variant(choice)`` and its estimate read from ``llo`` (the program's own profiles are
    kept aside, ``llo_static``; a variant two sets share is compiled once); the kernels' own DMAs
    by the bytes they moved (``dmas.py``). The facts are the timing input's (the first set), with
    every set's in ``sets``: the estimate's figure is the slowest (``timing/compiler_estimate.py``).
    They name every site, variant and DMA."""
    import gc
    import time

    import jax

    from evaluator.figure.timing.compiler_estimate import read_cycles

    t0 = time.perf_counter()
    jax.clear_caches()    # the interpreted programs are done with: their executables hold memory
    gc.collect()          # the variants' compiles need (RLIMIT_AS, evaluator/containment/sandbox.py Limits)
    compiled: dict[tuple, int] = {}

    def estimate(choice) -> int:
        key = tuple(sorted(choice.items()))
        if key in compiled:
            return compiled[key]
        for path in llo.glob("*") if llo.is_dir() else ():
            path.unlink()
        compile_variant(choice)
        cycles, why = read_cycles(llo)
        if cycles is None:
            raise Uncountable(f"a variant has no estimate: {why}")
        compiled[key] = cycles
        return cycles

    found = kernel_sites(closed)
    grids = counting.grids or [0] * len(found)
    shapes = counting.prefetch or [None] * len(found)
    static = None
    if any(found) or any(grids):
        llo.rename(llo.with_name("llo_static"))
    else:                 # no loop or branch on data: the program's own estimate stands
        static = read_cycles(llo)
    per_set = []
    for counted in counted_sets:
        try:
            counts, bounds, prefetch = dynamic_grid.split([jax.device_get(c) for c in counted], grids, shapes)
            facts = dmas.counted(counting.dmas, dma_starts(found, counts))
            facts["_prefetch"] = prefetch      # the runner's, for the traffic model (never reported)
            if any(grids):
                facts["grid_bounds"] = bounds
            if static is None:
                facts |= figure(found, counts, estimate, dynamic_grid.choice(bounds))
            else:
                facts |= {"cycles": static[0]} if static[0] is not None else {"error": static[1]}
        except Uncountable as exc:
            facts = {"error": str(exc)}
        per_set.append(facts)
    first = dict(per_set[0]) if per_set else {"error": "no input set was counted"}
    return first | {"sets": per_set, "variants_compiled": len(compiled), "trips_time_s": time.perf_counter() - t0}
