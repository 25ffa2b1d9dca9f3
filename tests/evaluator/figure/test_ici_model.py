"""The ICI collective model: its arithmetic on hand-computed cases, its refusals, and the real profile dump."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from evaluator.figure.collectives import (Collective, NotModelled, array_bytes, collectives_in_hlo,
                                          collectives_in_profile)
from evaluator.figure.ici_model import ICI_FIGURES, collective_cost, collective_seconds, model_collectives
from evaluator.figure.timing.compiler_estimate import DUMP_FLAG, read_cycles

V5E = ICI_FIGURES["v5e"]
W = 4.5e10          # v5e one-way bytes/s per link, as stated in the module
HOP, OVERHEAD = 1e-6, 5e-6
ALL4 = ((0, 1, 2, 3),)


def test_figures_are_the_stated_public_ones():
    assert (V5E.link_bytes_per_s, V5E.links_per_chip, V5E.hop_latency_s) == (W, 4, HOP)
    assert (ICI_FIGURES["v6e"].link_bytes_per_s, ICI_FIGURES["v6e"].links_per_chip) == (9e10, 4)
    for fig in ICI_FIGURES.values():
        assert any("cloud.google.com/tpu/docs/" + fig.chip in s for s in fig.sources)
        assert any("scaling-book" in s for s in fig.sources)


def test_all_reduce_8x128_f32_over_the_2x2_is_a_bidirectional_ring():
    # 4096 bytes per chip; the 2x2 mesh is a 4-cycle, so both directions carry half:
    # 2*(n-1)/n * V / (2W) + 2*(n-1) single-hop steps + the per-collective overhead.
    c = Collective("all-reduce", "ar", 8 * 128 * 4, ALL4)
    expected = 2 * 3 / 4 * 4096 / (2 * W) + 6 * HOP + OVERHEAD
    assert collective_seconds(c, V5E) == pytest.approx(expected, rel=1e-12)
    assert collective_seconds(c, V5E) == pytest.approx(11.0683e-6, rel=1e-4)
    big = Collective("all-reduce", "ar", 64 << 20, ALL4)     # 64 MiB: bandwidth-bound
    assert collective_cost(big, V5E).bandwidth_s == pytest.approx(1.5 * (64 << 20) / (2 * W))
    v6e = collective_cost(big, ICI_FIGURES["v6e"]).bandwidth_s
    assert v6e == pytest.approx(collective_cost(big, V5E).bandwidth_s / 2)


def test_empty_replica_groups_mean_every_chip():
    assert collective_seconds(Collective("all-reduce", "ar", 4096), V5E) == \
        collective_seconds(Collective("all-reduce", "ar", 4096, ALL4), V5E)


def test_all_gather_and_reduce_scatter_move_n_minus_1_over_n():
    v = 32 * 128 * 2
    for kind in ("all-gather", "reduce-scatter"):
        c = Collective(kind, "x", v, ALL4)
        assert collective_seconds(c, V5E) == pytest.approx(3 / 4 * v / (2 * W) + 3 * HOP + OVERHEAD)


def test_pairs_use_one_link_and_a_diagonal_pair_pays_two_hops():
    v = 1 << 20
    # devices 0..3 sit at (0,0),(1,0),(0,1),(1,1): {0,1} and {0,2} are neighbours, {0,3} is the diagonal.
    for pair in ((0, 1), (0, 2), (2, 3)):
        c = Collective("all-gather", "ag", v, (pair,))
        assert collective_seconds(c, V5E) == pytest.approx(v / 2 / W + HOP + OVERHEAD)
    both = Collective("all-gather", "ag", v, ((0, 1), (2, 3)))   # two groups on disjoint links
    assert collective_seconds(both, V5E) == pytest.approx(v / 2 / W + HOP + OVERHEAD)
    diag = Collective("all-gather", "ag", v, ((0, 3),))
    assert collective_seconds(diag, V5E) == pytest.approx(v / 2 / W + 2 * HOP + OVERHEAD)


def test_a_line_without_wraparound_gets_one_way_bandwidth():
    # A 4-chip axis of a 4x4 v5e slice has no wraparound (only 16-chip axes do): the scaling book's
    # (n-1) * shard / one-way bandwidth, not the bidirectional figure.
    v = 64 << 20
    c = Collective("all-gather", "ag", v, ((0, 1, 2, 3),))
    assert collective_cost(c, V5E, (4, 4)).bandwidth_s == pytest.approx(3 / 4 * v / W)
    wrapped = collective_cost(c, V5E, (4, 16))      # the same line would be a ring on a 16-chip axis
    ring16 = Collective("all-gather", "ag", v, (tuple(range(0, 64, 4)),))
    assert collective_cost(ring16, V5E, (4, 16)).bandwidth_s == pytest.approx(15 / 16 * v / (2 * W))
    assert wrapped.bandwidth_s == pytest.approx(3 / 4 * v / W)


def test_collective_permute_by_hops_and_link_load():
    v = 1 << 20
    one = Collective("collective-permute", "cp", v, source_target_pairs=((0, 1),))
    assert collective_seconds(one, V5E) == pytest.approx(v / W + HOP + OVERHEAD)
    # The ring shift 0->1->2->3->0 in device ids: 1->2 and 3->0 are diagonals (2 hops); no link carries two.
    shift = Collective("collective-permute", "cp", v, source_target_pairs=((0, 1), (1, 2), (2, 3), (3, 0)))
    assert collective_seconds(shift, V5E) == pytest.approx(v / W + 2 * HOP + OVERHEAD)
    # Two sources into one chip over the same last link: twice the bytes on it.
    merge = Collective("collective-permute", "cp", v, source_target_pairs=((1, 0), (3, 2)))
    assert collective_seconds(merge, V5E) == pytest.approx(v / W + HOP + OVERHEAD)
    funnel = Collective("collective-permute", "cp", v, source_target_pairs=((3, 0), (2, 0)))
    assert collective_cost(funnel, V5E).bandwidth_s == pytest.approx(2 * v / W)


def test_all_to_all_on_the_2x2():
    # Each chip sends V/4 to each of 3 others; routed x then y, every directed link carries V/2.
    v = 1 << 20
    c = Collective("all-to-all", "a2a", v, ALL4)
    assert collective_seconds(c, V5E) == pytest.approx(v / 2 / W + 2 * HOP + OVERHEAD)


def test_what_is_not_modelled_is_never_zero():
    with pytest.raises(NotModelled, match="ragged-all-to-all"):
        collective_seconds(Collective("ragged-all-to-all", "r", 4096, ALL4), V5E)
    with pytest.raises(NotModelled, match="outside"):
        collective_seconds(Collective("all-reduce", "ar", 4096, ((0, 7),)), V5E)
    with pytest.raises(NotModelled):
        collective_seconds(Collective("collective-permute", "cp", 4096), V5E)
    with pytest.raises(NotModelled):
        array_bytes("F7E1", [8, 128])


def test_layout_tiles_pad_the_bytes():
    assert array_bytes("F32", [8, 128]) == 4096
    assert array_bytes("F32", [1, 128], [1, 0], [8, 128]) == 4096
    assert array_bytes("BF16", [3, 200], [1, 0], [8, 128]) == 8 * 256 * 2
    assert array_bytes("F32", [], None, [128]) == 512
    assert array_bytes("S4", [8, 128]) == 512


_PROFILE = """hlo_op_estimate {{
  hlo_op_name: "{name}"
  estimated_cycles: 0
  dma_instruction_type: DMA_INSTRUCTION_TYPE_LOCAL_AND_REMOTE
  hlo_instruction {{
    name: "{name}"
    opcode: "{opcode}"
    shape {{ element_type: F32 dimensions: 8 dimensions: 128
      layout {{ minor_to_major: 1 minor_to_major: 0 tiles {{ dimensions: 8 dimensions: 128 }} }} }}
    metadata {{ op_name: "jit(f)/x" }}
    backend_config: "{{\\"barrier_config\\":{{\\"id\\":\\"0\\"}}}}"
    collective_device_list {{ replica_groups {{ replica_ids: 0 replica_ids: 1 replica_ids: 2 replica_ids: 3 }} }}
  }}
}}
"""


def test_unknown_remote_ops_in_a_profile_are_reported(tmp_path):
    (tmp_path / "ar_static_llo_profile.textproto").write_text(_PROFILE.format(name="ar", opcode="all-reduce"))
    (tmp_path / "rag_static_llo_profile.textproto").write_text(_PROFILE.format(name="rag", opcode="ragged-all-to-all"))
    (tmp_path / "k_static_llo_profile.textproto").write_text(
        _PROFILE.format(name="k", opcode="custom-call").replace("estimated_cycles: 0", "estimated_cycles: 900"))
    (tmp_path / "f_static_llo_profile.textproto").write_text(
        'hlo_op_estimate {\n  hlo_op_name: "f"\n  estimated_cycles: 10\n'
        '  dma_instruction_type: DMA_INSTRUCTION_TYPE_NONE\n}\n')
    result = model_collectives(tmp_path, "v5e", hlo_text="")
    assert [c.collective.op_name for c in result.costs] == ["ar"]
    assert result.seconds == pytest.approx(2 * 3 / 4 * 4096 / (2 * W) + 6 * HOP + OVERHEAD)
    assert not result.complete
    assert sorted(u.op_name for u in result.not_modelled) == ["k", "rag"]
    assert result.op_names == {"ar", "k", "rag"}


_PROGRAM = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    topo = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu")
    mesh = Mesh(np.array(topo.devices).reshape(4), ("x",))
    def combine(m, l):   # log-sum-exp of per-chip partials, then a ring shift
        g = jax.lax.pmax(m, "x")
        out = jnp.log(jax.lax.psum(l * jnp.exp(m - g), "x")) + g
        return jax.lax.ppermute(out, "x", [(i, (i + 1) % 4) for i in range(4)])
    spec = jax.ShapeDtypeStruct((32, 128), jnp.float32, sharding=NamedSharding(mesh, P("x")))
    f = jax.shard_map(combine, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x"))
    open(sys.argv[1], "w").write(jax.jit(f).lower(spec, spec).compile().as_text())
""")


@pytest.fixture(scope="module")
def compiled_2x2(tmp_path_factory):
    """A tiny shard_map over v5e:2x2, compiled ahead of time with the static profile dump (one process)."""
    root = tmp_path_factory.mktemp("ici")
    env = dict(os.environ, LIBTPU_INIT_ARGS=f"{DUMP_FLAG}={root / 'llo'}", ALLOW_MULTIPLE_LIBTPU_LOAD="1",
               TPU_ACCELERATOR_TYPE="v5litepod-4", TPU_WORKER_HOSTNAMES="localhost")
    proc = subprocess.run([sys.executable, "-c", _PROGRAM, str(root / "hlo.txt")], env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return root / "llo", (root / "hlo.txt").read_text()


def test_the_real_profile_of_a_pmax_psum_combine(compiled_2x2):
    llo, hlo = compiled_2x2
    found = collectives_in_profile(llo)
    assert sorted(c.jax_op.rsplit("/", 1)[-1] for c in found) == ["pmax", "psum_invariant"]
    for c in found:
        assert (c.kind, c.bytes, c.replica_groups, c.estimated_cycles) == ("all-reduce", 8 * 128 * 4, ALL4, 0)
    # The judge's own reader sees exactly these as the ops without an estimate.
    unestimated: list[str] = []
    cycles, _ = read_cycles(llo, unestimated=unestimated)
    assert cycles and sorted(u.split("'")[1] for u in unestimated) == sorted(c.op_name for c in found)
    # The ppermute writes no profile file: only the HLO text shows it.
    assert not any(c.kind == "collective-permute" for c in found)
    assert [c.kind for c in collectives_in_hlo(hlo)].count("collective-permute") == 1
    blind = model_collectives(llo, "v5e")
    assert blind.notes and len(blind.costs) == 2
    full = model_collectives(llo, "v5e", hlo_text=hlo)
    assert full.complete and len(full.costs) == 3
    ar = 2 * (2 * 3 / 4 * 4096 / (2 * W) + 6 * HOP + OVERHEAD)
    cp = 4096 / W + 2 * HOP + OVERHEAD
    assert full.seconds == pytest.approx(ar + cp)


def test_the_judge_reader_and_this_parser_glob_the_same_files(compiled_2x2):
    llo, _ = compiled_2x2
    names = {p.name for p in Path(llo).glob("*static_llo_profile*.textproto")}
    assert {f"{c.op_name}_static_llo_profile.textproto" for c in collectives_in_profile(llo)} <= names
