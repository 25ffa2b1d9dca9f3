"""The public API: values, registry, read_tunables, replay."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

import mutations
from mutations import Edit, MutationResult, Operator, get_operator, read_tunables, replay
from mutations.registry import all_operators
from seeds.flash_attention.task import AttentionTask

from .kernel_check import seed_source

TASK = AttentionTask(batch=1, heads=2, seq_len=256, head_dim=128, causal=True)
REQUIRED = {"block_sizes", "compact_scratch", "deferred_norm", "causal_skip", "head_coarsening",
            "vmem_limit"}


def test_registry_has_the_operators():
    ops = all_operators()
    assert REQUIRED <= {op.name for op in ops}
    assert len({op.name for op in ops}) == len(ops)
    for op in ops:
        assert isinstance(op, Operator)
        assert op.description and "\n" not in op.description
        assert get_operator(op.name) is op
    assert mutations.registry.all_operators() == ops


def test_unknown_operator_lists_names():
    with pytest.raises(KeyError) as info:
        get_operator("nope")
    assert "nope" in str(info.value) and "causal_skip" in str(info.value)


def test_values_are_frozen_and_edit_json_round_trips():
    edit = Edit("block_sizes", {"tunable": "BLOCK_Q", "value": 256})
    assert Edit.from_json(edit.to_json()) == edit
    assert json.loads(edit.to_json()) == {"op": "block_sizes", "params": {"tunable": "BLOCK_Q", "value": 256}}
    assert hash(edit) == hash(Edit.from_dict(edit.to_dict()))
    with pytest.raises(dataclasses.FrozenInstanceError):
        edit.op = "x"  # type: ignore[misc]
    result = MutationResult("applied", "x = 1\n", edit, "")
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.status = "failed"  # type: ignore[misc]
    assert get_operator("block_sizes").apply_params("BLOCK_Q = 128\n", TASK, {"v": object()}).status == "failed"


def test_read_tunables():
    assert read_tunables(seed_source()) == {"BLOCK_Q": 128, "BLOCK_KV": 128}
    source = "BLOCK_Q = 256\nVMEM_LIMIT_BYTES = 48 * 1024 * 1024\nHEADS_PER_PROGRAM = 2\nOTHER = 3\nx = 4\n"
    assert read_tunables(source) == {"BLOCK_Q": 256, "VMEM_LIMIT_BYTES": 48 << 20, "HEADS_PER_PROGRAM": 2}
    assert read_tunables("def (:") == {}


def test_replay_reproduces_an_edit_history():
    seed = seed_source()
    rng = random.Random(5)
    source, edits = seed, []
    for name in ("causal_skip", "head_coarsening", "deferred_norm", "block_sizes", "vmem_limit"):
        result = get_operator(name).apply(source, TASK, rng)
        assert result.status == "applied", (name, result.reason)
        source, edits = result.source, edits + [result.edit]
    replayed = replay(seed, edits, TASK)
    assert replayed.status == "applied" and replayed.source == source
    assert replayed.edit == edits[-1]
    # JSON round trip of the history, as an archive would store it
    stored = json.loads(json.dumps([e.to_dict() for e in edits]))
    assert replay(seed, stored, TASK).source == source
    assert replay(seed, [], TASK) == MutationResult("applied", seed, None, "replayed 0 edit(s)")


def test_replay_reports_the_first_edit_that_does_not_apply():
    seed = seed_source()
    edits = [Edit("deferred_norm"), Edit("deferred_norm")]
    result = replay(seed, edits, TASK)
    assert result.status == "not_applicable" and "edit 1" in result.reason
    # The source is the seed with the edits before the failing one applied (here: the first one).
    assert result.source != seed and "deferred" in result.source.lower()
    assert replay(seed, edits[:1], TASK).source == result.source
    assert replay(seed, [Edit("causal_skip")], AttentionTask(causal=False)).status == "not_applicable"
    assert replay(seed, [Edit("nope")], TASK).status == "failed"


def test_the_search_finds_the_block_shape_through_the_operator_that_sets_it():
    """The search names no operator: it asks the registry for the one that sets a block shape
    (``Operator.sets_shape``), and that operator for the shape's tunables, their legal values and
    the edits that set a shape (one per module constant)."""
    from mutations.registry import shape_operator
    from seeds import load_seed

    op = shape_operator()
    assert op is not None and op.sets_shape and sum(o.sets_shape for o in all_operators()) == 1
    seed = load_seed("flash_attention")
    task = seed.task("B=1,H=2,N=512,D=128")
    values = op.shape_values(seed.kernel_source, task)
    assert list(values) == ["BLOCK_Q", "BLOCK_KV"]
    assert all(op.shape_legal(n, task) for n in values)
    moves = op.shape_moves(seed.kernel_source, task, {"BLOCK_Q": 256, "BLOCK_KV": 512})
    assert moves == [{"tunable": "BLOCK_Q", "value": 256}, {"tunable": "BLOCK_KV", "value": 512}]
    source = seed.kernel_source
    for params in moves:
        source = op.apply_params(source, task, params).source
    assert op.shape_values(source, task) == {"BLOCK_Q": 256, "BLOCK_KV": 512}
