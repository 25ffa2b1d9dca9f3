"""The operator contract, for every operator in the registry on every seed (each built-in seed and
the axpy example), at each seed's default task and at small tasks: a new operator or a new seed
joins without editing this file.

* check() returns an Applicability and never raises: on the seed's kernel, on the other seeds'
  kernels, on sources that do not parse; "not applicable" always says why;
* apply() never raises and returns applied / not_applicable / failed ("failed" on a built-in
  seed's own kernel is a bug); the same generator state gives the same result;
* an applied result carries an Edit that round-trips through JSON and that apply_params turns
  back into exactly the same source, which compiles; the same edit does not apply to it again;
* illegal parameters give not_applicable or failed, never an exception;
* a fit-only operator (the VMEM limit) gives a kernel and its own rewrites one fit key.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from mutations import Applicability, Edit, MutationResult, all_operators
from seeds import builtin_seeds

from .seed_cases import SeedCase, seed_cases, seeds

STATUSES = ("applied", "not_applicable", "failed")
RNG_SEEDS = (0, 1, 2, 3)
# Sources no operator may apply to (the truncated seed kernel is added per case).
GARBAGE = ("", "def (:\n", "x = 1\n", "import jax\n", "def f(:\n    return pl.pallas_call(\n")

# Illegal parameters an operator accepts today: (operator, parameter, value) -> why it is a bug.
# The test expects exactly these to be accepted (xfail), and fails when one is fixed: remove it.
KNOWN_ACCEPTED: dict[tuple[str, str, Any], str] = {}

OPS = all_operators()
CASES = seed_cases()
OP_CASES = [pytest.param(op, case, id=f"{op.name}-{case.id}") for op in OPS for case in CASES]
# check() is a pure function of (source, task) that never raises (tested below): split on it.
APPLICABLE = [p for p in OP_CASES if p.values[0].check(p.values[1].source, p.values[1].task).ok]
NOT_APPLICABLE = [p for p in OP_CASES if p not in APPLICABLE]


def _other_kernels(case: SeedCase) -> list[str]:
    return sorted({seed.kernel_source for seed, _ in seeds()} - {case.source})


def _assert_not_applicable(result: MutationResult, source: str) -> None:
    assert result.status == "not_applicable" and result.source == source
    assert isinstance(result.reason, str) and result.reason.strip()


def _assert_result(result: MutationResult, source: str, op) -> None:
    assert isinstance(result, MutationResult) and result.status in STATUSES, result
    assert isinstance(result.reason, str)
    if result.applied:
        assert result.source != source and result.reason == ""
        assert isinstance(result.edit, Edit) and result.edit.op == op.name
        compile(result.source, f"<{op.name}>", "exec")
    else:
        assert result.source == source and result.reason.strip()


def test_every_seed_has_a_small_task():
    assert all("small" in seed.task_class.test_tasks for seed, _ in seeds())
    assert {case.seed.name for case in CASES} >= set(builtin_seeds()) | {"axpy"}


def test_the_registry_is_not_empty_and_names_are_unique():
    assert OPS and len({op.name for op in OPS}) == len(OPS)


@pytest.mark.parametrize("op, case", OP_CASES)
def test_check_is_a_value_and_never_raises(op, case):
    own = op.check(case.source, case.task)
    assert isinstance(own, Applicability) and isinstance(own.ok, bool) and bool(own) is own.ok
    if not own.ok:
        assert isinstance(own.reason, str) and own.reason.strip(), "not applicable without saying why"
    truncated = case.source[: len(case.source) // 2] + "\ndef (:\n"    # a kernel with a syntax error
    for source in (*GARBAGE, truncated):
        applicability = op.check(source, case.task)
        assert isinstance(applicability, Applicability) and not applicability.ok, repr(source[:40])
        assert applicability.reason.strip()
        result = op.apply(source, case.task, random.Random(0))
        _assert_not_applicable(result, source)
        assert result.reason == applicability.reason
        with pytest.raises(ValueError):
            op.sample_params(source, case.task, random.Random(0))
    # Another seed's kernel under this seed's task: any answer, as a value; a rewrite compiles
    # (applied at the default task only: rewrites are what costs).
    for source in _other_kernels(case):
        applicability = op.check(source, case.task)
        assert isinstance(applicability, Applicability)
        assert applicability.ok or applicability.reason.strip()
        if case.label == "default":
            _assert_result(op.apply(source, case.task, random.Random(0)), source, op)


@pytest.mark.parametrize("op, case", NOT_APPLICABLE)
def test_not_applicable_says_why_and_changes_nothing(op, case):
    source, task = case.source, case.task
    applicability = op.check(source, task)
    assert not applicability.ok and applicability.reason.strip()
    for rng_seed in RNG_SEEDS:
        result = op.apply(source, task, random.Random(rng_seed))
        _assert_not_applicable(result, source)
        assert result.reason == applicability.reason and result.edit is None
    with pytest.raises(ValueError):
        op.sample_params(source, task, random.Random(0))
    _assert_not_applicable(op.apply_params(source, task, {}), source)


@pytest.mark.parametrize("op, case", APPLICABLE)
def test_apply_is_deterministic_and_its_edit_replays(op, case):
    source, task = case.source, case.task
    rng_a, rng_b = random.Random(RNG_SEEDS[0]), random.Random(RNG_SEEDS[0])
    first = op.apply(source, task, rng_a)
    assert op.apply(source, task, rng_b) == first, "the same generator state gave another result"
    assert rng_a.getstate() == rng_b.getstate()
    results = {first.edit.to_json() if first.edit else "": first}
    for rng_seed in RNG_SEEDS[1:]:      # more parameter draws (sampling alone is cheap)
        params = op.sample_params(source, task, random.Random(rng_seed))
        assert op.sample_params(source, task, random.Random(rng_seed)) == params
        if Edit(op.name, params).to_json() not in results:
            result = op.apply(source, task, random.Random(rng_seed))
            results[result.edit.to_json() if result.edit else ""] = result
    for result in results.values():
        _assert_result(result, source, op)
        if case.builtin:     # check() said yes: the sampled parameters must apply
            assert result.status == "applied", f"{op.name} on {case.id}: {result.status}: {result.reason}"
        if not result.applied:
            continue
        text = result.edit.to_json()
        edit = Edit.from_json(json.dumps(json.loads(text)))
        assert edit == result.edit and edit.to_json() == text
        assert op.apply_params(source, task, edit.params) == result, \
            "apply_params(edit.params) does not reproduce the applied result"
        # The same edit again on its own output does nothing: no double rewrite.
        _assert_not_applicable(op.apply_params(result.source, task, edit.params), result.source)
    # A key the operator does not know is refused, or ignored: it never changes the rewrite.
    edit = next(r.edit for r in results.values() if r.applied)
    unknown = op.apply_params(source, task, {**edit.params, "unknown_parameter": 1})
    if unknown.applied:
        assert unknown.source == results[edit.to_json()].source
    else:
        _assert_result(unknown, source, op)


def _illegal_values(value: Any) -> list[Any]:
    """Values of a parameter's type that no operator may accept in place of ``value``."""
    if isinstance(value, bool):
        return [None, 0, 1, "true", [value], {}]
    if isinstance(value, int):
        return [None, True, False, -1, 0, 10**9, 1.5, "x", str(value), [value], {}]
    if isinstance(value, str):
        return [None, "", "NOT_A_TUNABLE", 1, [value], value.lower() + "_"]
    return [None, "x", -1]


@pytest.mark.parametrize("op, case", APPLICABLE)
def test_illegal_parameters_are_refused_never_raised(op, case):
    source, task = case.source, case.task
    legal = op.sample_params(source, task, random.Random(0))
    not_json = op.apply_params(source, task, {"x": object()})
    assert not_json.status == "failed" and not_json.source == source and not_json.reason
    assert op.apply_params(source, task, None).status == "failed"     # type: ignore[arg-type]
    # A value the operator's own sampler gives is legal (e.g. axis=0), whatever its type's usual suspects.
    sampled = [op.sample_params(source, task, random.Random(i)) for i in range(20)]
    trials: list[tuple[str, Any, dict]] = []
    for key, value in legal.items():
        seen = {(type(p[key]), p[key]) for p in sampled if key in p and isinstance(p[key], (int, str))}
        trials.append((key, "<missing>", {k: v for k, v in legal.items() if k != key}))
        trials += [(key, bad, {**legal, key: bad}) for bad in _illegal_values(value)
                   if not (isinstance(bad, (int, str)) and (type(bad), bad) in seen)]
    accepted = set()
    for key, bad, params in trials:
        result = op.apply_params(source, task, params)
        assert isinstance(result, MutationResult) and result.status in STATUSES
        if result.applied:
            accepted.add((op.name, key, bad))
        else:
            _assert_result(result, source, op)
    known = {k for k in KNOWN_ACCEPTED if k[0] == op.name and any(k[1:] == t[:2] for t in trials)}
    assert accepted <= known, f"illegal parameters applied: {sorted(accepted - known, key=str)}"
    assert accepted == known, f"fixed, remove from KNOWN_ACCEPTED: {sorted(known - accepted, key=str)}"
    if known:
        pytest.xfail("; ".join(KNOWN_ACCEPTED[k] for k in sorted(known, key=str)))


KNOB_CASES = [p for p in APPLICABLE if p.values[0].knob]


@pytest.mark.parametrize("op,case", KNOB_CASES)
def test_a_knob_gives_the_ablation_grid_settings_of_its_own_edits_that_apply(op, case):
    """``grid_settings`` (what the ablation's grid varies a knob over): a non-empty list of tuples of
    this operator's edits, each of which applies to the seed (or is where the seed already is)."""
    tried = [r.edit for seed in RNG_SEEDS if (r := op.apply(case.source, case.task, random.Random(seed))).applied]
    settings = op.grid_settings(case.source, case.task, tried, tried[0] if tried else None)
    assert settings and all(isinstance(s, tuple) for s in settings)
    for setting in settings:
        source = case.source
        for edit in setting:
            assert isinstance(edit, Edit) and edit.op == op.name
            result = op.apply_params(source, case.task, edit.params)
            assert result.applied or result.reason == "the rewrite changes nothing", (edit, result.reason)
            source = result.source


@pytest.mark.parametrize("op, case", APPLICABLE)
def test_a_fit_key_is_the_same_for_every_setting_of_a_fit_only_operator(op, case):
    """``fit_key``: an operator that changes the figure keys a kernel by its source; one that
    decides only whether a kernel fits (``fit_only``) gives the kernel and every rewrite of its
    own the same key, and the key keys to itself (the search breeds none of them twice)."""
    source, task = case.source, case.task
    key = op.fit_key(source, task)
    if not op.fit_only:
        assert key == source
        return
    assert op.fit_key(key, task) == key
    for rng_seed in RNG_SEEDS:
        result = op.apply(source, task, random.Random(rng_seed))
        if result.applied:
            assert op.fit_key(result.source, task) == key, result.edit
