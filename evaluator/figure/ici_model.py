"""An explicit cost model for a multi-chip program's collectives over ICI (the static profile gives them 0).

libtpu's static LLO profile (``--xla_jf_dump_static_llo_profile_to``, see
``evaluator.figure.timing.compiler_estimate``) writes ``<op>_static_llo_profile.textproto`` per HLO op. A
collective's file (all-reduce, all-gather, reduce-scatter, all-to-all) says ``estimated_cycles: 0`` and
``dma_instruction_type: DMA_INSTRUCTION_TYPE_LOCAL_AND_REMOTE``, but carries the op's ``hlo_instruction``
(opcode, shape, element type, replica groups) and ``operand_shapes``: enough to know its bytes.
Seen with libtpu 0.0.42.1 on v5e:2x2: an async ``collective-permute-start``/``-done`` pair writes NO
profile file at all, so the compiled HLO text (``compiled.as_text()``) must be read too; without it such
collectives are invisible and the result says so.

Model, per collective: routed over the chips' mesh (dimension-order routing, wraparound only on full-pod
axes), ``time = max over directed links of (bytes on the link) / one-way link bandwidth
+ steps * hops per step * hop latency + a fixed per-collective overhead``. On a ring this is the textbook
``2(n-1)/n * V / W`` for an all-reduce and ``(n-1)/n * V / W`` for an all-gather or reduce-scatter, with
``W`` twice the one-way link bandwidth where the ring has links both ways (the 2x2 mesh is a 4-cycle),
one-way where it does not (a line without wraparound). Collectives are summed as if serial (no overlap
with compute or with each other): an upper-side figure. Anything not covered is reported, never 0.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from evaluator.figure.collectives import (COLLECTIVE_KINDS, Collective, NotModelled, Unmodelled, collectives_in_hlo,
                                   collectives_in_profile)



@dataclasses.dataclass(frozen=True)
class IciFigures:
    """Public ICI figures for one chip; every number names its source."""
    chip: str
    link_bytes_per_s: float      # ONE-WAY bandwidth of one ICI link
    links_per_chip: int          # ICI ports per chip (a 2x2 slice without wraparound wires 2 of them)
    hop_latency_s: float         # fixed cost of one hop, whatever the size
    collective_overhead_s: float  # fixed cost of one collective on top of its hops (an assumption)
    wraparound_axis_len: int     # an axis has a wraparound link only at this length (the full pod)
    sources: tuple[str, ...]


_BOOK_TPUS = "How to Scale Your Model, part 2 'How to Think About TPUs', https://jax-ml.github.io/scaling-book/tpus/"
_BOOK_SHARDING = "How to Scale Your Model, part 3 'Sharding', https://jax-ml.github.io/scaling-book/sharding/"
_LATENCY_SOURCES = (
    f"hop latency 1 us: {_BOOK_SHARDING} ('Each hop over an ICI link has some intrinsic overhead "
    "regardless of the data volume. This is typically around 1us.')",
    f"overhead 5 us: ASSUMPTION derived from {_BOOK_SHARDING}, worked problem 1: a latency-bound "
    "AllGather over 4 v5e chips (3 hops, ~3 us by the hop model) measured 'closer to 8us'; the 5 us "
    "gap is charged to every collective. No public per-collective latency for v6e: the same is assumed",
    f"no wraparound below a 16-chip axis on v5e/v6e: {_BOOK_TPUS} (interconnect footnote)",
)
ICI_FIGURES: dict[str, IciFigures] = {
    # Google Cloud, https://cloud.google.com/tpu/docs/v5e: 'Bidirectional inter-chip interconnect (ICI)
    # bandwidth (per chip) 400 GBps', 'ICI ports per chip 4' -> 100 GB/s both ways = 5e10 one-way per
    # link. The scaling book's table says 4.5e10 one-way (Feb 2025 text) and 5e10 (a later revision).
    # We take the lowest, 4.5e10: a judge must not make communication cheaper than the sources allow.
    "v5e": IciFigures("v5e", 4.5e10, 4, 1e-6, 5e-6, 16, (
        "link 4.5e10 B/s one-way: " + _BOOK_TPUS + " (ICI BW/link table, Feb 2025); cloud.google.com/"
        "tpu/docs/v5e gives 400 GBps bidirectional per chip over 4 ports = 5e10 one-way per link",
        "4 ICI ports per chip, 2D torus: https://cloud.google.com/tpu/docs/v5e") + _LATENCY_SOURCES),
    # Google Cloud, https://cloud.google.com/tpu/docs/v6e: 'Bidirectional ... ICI bandwidth (per chip)
    # 800 GBps', 'ICI ports per chip 4' -> 1e11 one-way per link; the scaling book: 9e10 (Feb 2025),
    # 1e11 (later). The lowest, 9e10, again.
    "v6e": IciFigures("v6e", 9e10, 4, 1e-6, 5e-6, 16, (
        "link 9e10 B/s one-way: " + _BOOK_TPUS + " (ICI BW/link table, Feb 2025); cloud.google.com/"
        "tpu/docs/v6e gives 800 GBps bidirectional per chip over 4 ports = 1e11 one-way per link",
        "4 ICI ports per chip, 2D torus: https://cloud.google.com/tpu/docs/v6e") + _LATENCY_SOURCES),
}


@dataclasses.dataclass(frozen=True)
class CollectiveCost:
    collective: Collective
    seconds: float
    bandwidth_s: float
    latency_s: float


@dataclasses.dataclass(frozen=True)
class IciModelResult:
    chip: str
    seconds: float               # sum over the modelled collectives only
    costs: tuple[CollectiveCost, ...]
    not_modelled: tuple[Unmodelled, ...]
    notes: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        """True when every collective found was modelled (``seconds`` is then the whole ICI cost)."""
        return not self.not_modelled

    @property
    def op_names(self) -> frozenset[str]:
        """Ops this result accounts for: their 0-cycle profile files are not 'unestimated'."""
        return frozenset(c.collective.op_name for c in self.costs) | {u.op_name for u in self.not_modelled}


# ---------------------------------------------------------------- the model
def _coords(device: int, mesh_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Device id -> mesh coordinates, first axis fastest (v5e:2x2 devices 0..3 are at (0,0),(1,0),(0,1),(1,1))."""
    if not 0 <= device < math.prod(mesh_shape):
        raise NotModelled(f"device {device} is outside the {'x'.join(map(str, mesh_shape))} mesh")
    out = []
    for n in mesh_shape:
        out.append(device % n)
        device //= n
    return tuple(out)


def _route(src: int, dst: int, mesh_shape: tuple[int, ...], wrap: tuple[bool, ...]) -> list[tuple]:
    """Directed links (from, to) of the dimension-order route from src to dst."""
    here, goal, links = list(_coords(src, mesh_shape)), _coords(dst, mesh_shape), []
    for axis, n in enumerate(mesh_shape):
        fwd = (goal[axis] - here[axis]) % n
        step = (1 if fwd <= n - fwd else -1) if wrap[axis] else (1 if goal[axis] > here[axis] else -1)
        while here[axis] != goal[axis]:
            nxt = list(here)
            nxt[axis] = (here[axis] + step) % n
            links.append((tuple(here), tuple(nxt)))
            here = nxt
    return links


def _transfer_time(flows: list[tuple[int, int, float]], fig: IciFigures, mesh_shape, wrap) -> tuple[float, int]:
    """(seconds on the busiest directed link, most hops of any flow) for concurrent flows (src, dst, bytes)."""
    load: dict[tuple, float] = {}
    hops = 0
    for src, dst, nbytes in flows:
        route = _route(src, dst, mesh_shape, wrap)
        hops = max(hops, len(route))
        for link in route:
            load[link] = load.get(link, 0.0) + nbytes
    return max(load.values(), default=0.0) / fig.link_bytes_per_s, hops


def _ring_order(group: tuple[int, ...], mesh_shape: tuple[int, ...]) -> list[int]:
    """The group in snake order over the mesh: a ring whose steps are single hops on a full rectangle."""
    def key(d: int) -> tuple:
        c = _coords(d, mesh_shape)
        return tuple(reversed([c[0] if sum(c[1:]) % 2 == 0 else mesh_shape[0] - 1 - c[0], *c[1:]]))
    return sorted(group, key=key)


def collective_seconds(c: Collective, chip_figures: IciFigures, mesh_shape: tuple[int, ...] = (2, 2)) -> float:
    """Seconds for one collective; raises NotModelled rather than ever answering 0 for an unknown."""
    return collective_cost(c, chip_figures, mesh_shape).seconds


def collective_cost(c: Collective, fig: IciFigures, mesh_shape: tuple[int, ...] = (2, 2)) -> CollectiveCost:
    """The cost of one collective, split into its bandwidth and latency parts (raises NotModelled)."""
    wrap = tuple(n >= fig.wraparound_axis_len for n in mesh_shape)
    n_dev = math.prod(mesh_shape)
    if c.kind not in COLLECTIVE_KINDS:
        raise NotModelled(f"collective kind {c.kind!r} is not modelled")
    if c.bytes <= 0:
        raise NotModelled("no byte count")
    if c.kind == "collective-permute":
        if not c.source_target_pairs:
            raise NotModelled("collective-permute without source_target_pairs")
        bw, hops = _transfer_time([(s, t, c.bytes) for s, t in c.source_target_pairs if s != t], fig,
                                  mesh_shape, wrap)
        lat = hops * fig.hop_latency_s + fig.collective_overhead_s
        return CollectiveCost(c, bw + lat, bw, lat)
    groups = c.replica_groups or (tuple(range(n_dev)),)
    if c.kind == "all-to-all":          # every chip sends bytes/n to every other member, all at once
        flows = [(s, t, c.bytes / len(g)) for g in groups for s in g for t in g if s != t]
        bw, hops = _transfer_time(flows, fig, mesh_shape, wrap)
        lat = hops * fig.hop_latency_s + fig.collective_overhead_s
        return CollectiveCost(c, bw + lat, bw, lat)
    # Ring algorithms: all-reduce = reduce-scatter + all-gather, each n-1 steps of bytes/n per ring edge.
    passes = 2 if c.kind == "all-reduce" else 1
    best: tuple[float, float] | None = None
    for both_ways in (False, True):     # one ring, or the data halved over the ring and its reverse
        flows, hops, steps = [], 0, 0
        for g in groups:
            n = len(g)
            if n < 2:
                continue
            ring = _ring_order(g, mesh_shape)
            edge_bytes = passes * (n - 1) / n * c.bytes / (2 if both_ways else 1)
            for i in range(n):
                a, b = ring[i], ring[(i + 1) % n]
                flows.append((a, b, edge_bytes))
                if both_ways:
                    flows.append((b, a, edge_bytes))
            steps = max(steps, passes * (n - 1))
        bw, hops = _transfer_time(flows, fig, mesh_shape, wrap)
        lat = (steps * max(hops, 1) * fig.hop_latency_s + fig.collective_overhead_s) if steps else 0.0
        if best is None or bw + lat < sum(best):
            best = (bw, lat)
    assert best is not None
    return CollectiveCost(c, sum(best), *best)


def model_collectives(profile_dir: Path | str, chip: str, *, hlo_text: str | None = None,
                      mesh_shape: tuple[int, ...] = (2, 2)) -> IciModelResult:
    """Every collective of one compiled program, costed; what could not be costed is listed, never dropped."""
    fig = ICI_FIGURES[chip]
    unmodelled: list[Unmodelled] = []
    found = collectives_in_profile(profile_dir, unmodelled)
    notes = []
    if hlo_text is None:
        notes.append("no HLO text given: async collectives (collective-permute-start/done) write no profile "
                     "file and are not counted")
    else:
        seen = {c.op_name for c in found} | {u.op_name for u in unmodelled}
        found += [c for c in collectives_in_hlo(hlo_text) if c.op_name not in seen]
    costs = []
    for c in found:
        try:
            costs.append(collective_cost(c, fig, mesh_shape))
        except NotModelled as e:
            unmodelled.append(Unmodelled(c.op_name, c.kind, str(e)))
    if any(c.collective.estimated_cycles for c in costs):
        notes.append("some collectives have a nonzero static estimate too: do not add both")
    return IciModelResult(chip, sum(c.seconds for c in costs), tuple(costs), tuple(unmodelled), tuple(notes))
