"""Whole-output tests: each operator that applies to a built-in seed, with fixed parameters, gives
exactly the source kept in expected/<operator>__<seed>[+<edits before>]__<params>.py.

A mismatch fails with a unified diff (expected -> actual). To accept new outputs on purpose,
regenerate the files and read the diff before committing it:

    UPDATE_EXPECTED=1 .venv/bin/python -m pytest -q tests/mutations/test_operator_outputs.py
    git diff tests/mutations/expected/
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from pathlib import Path

import pytest

from mutations import Edit, get_operator, replay

from .seed_cases import seeds

EXPECTED = Path(__file__).resolve().parent / "expected"
UPDATE = os.environ.get("UPDATE_EXPECTED") == "1"


@dataclasses.dataclass(frozen=True)
class Case:
    op: str
    seed: str
    params: tuple[tuple[str, object], ...] = ()
    before: tuple[Edit, ...] = ()      # edits applied to the seed first (an operator's prerequisite)
    shape: str | None = None           # None: the seed's default task
    chips: int = 1                     # the task's mesh (chip_split needs one)

    @property
    def name(self) -> str:
        params = dict(self.params)
        if set(params) == {"tunable", "value"}:
            short = f"{params['tunable']}={params['value']}"
        else:
            short = ",".join(f"{k}={v}" for k, v in sorted(params.items()))
        seed = "+".join([self.seed + (f"@{self.chips}chips" if self.chips > 1 else ""),
                         *(e.op for e in self.before)])
        return "__".join(filter(None, [self.op, seed, short]))


def case(op: str, seed: str, before=(), shape=None, chips=1, **params) -> Case:
    return Case(op, seed, tuple(sorted(params.items())), tuple(before), shape, chips)


CASES = [
    # flash_attention at its default (causal) task
    case("block_sizes", "flash_attention", tunable="BLOCK_KV", value=512),
    case("compact_scratch", "flash_attention"),
    case("deferred_norm", "flash_attention"),
    case("causal_skip", "flash_attention"),
    case("head_coarsening", "flash_attention", heads_per_program=2),
    case("vmem_limit", "flash_attention", mib=64),
    case("dimension_semantics", "flash_attention", axis=2, semantics="arbitrary"),
    case("exp2_softmax", "flash_attention"),
    case("diagonal_strips", "flash_attention", [Edit("causal_skip")], strip=256),
    case("approx_reciprocal", "flash_attention", [Edit("deferred_norm")]),
    # compositions an operator has code for
    case("deferred_norm", "flash_attention", [Edit("compact_scratch")]),
    case("deferred_norm", "flash_attention", [Edit("exp2_softmax")]),
    case("head_coarsening", "flash_attention", [Edit("causal_skip")], heads_per_program=2),
    case("diagonal_strips", "flash_attention",
         [Edit("head_coarsening", {"heads_per_program": 2}), Edit("causal_skip")], strip=256),
    # flash_decoding at its default task (grouped_heads: with grouped query heads)
    case("block_sizes", "flash_decoding", tunable="BLOCK_KV", value=1024),
    case("vmem_limit", "flash_decoding", mib=64),
    case("exp2_softmax", "flash_decoding"),
    case("dimension_semantics", "flash_decoding", axis=1, semantics="arbitrary"),
    case("length_skip", "flash_decoding", compute=False),
    case("length_skip", "flash_decoding", compute=True),
    case("grouped_heads", "flash_decoding", shape="HKV=2"),
    case("split_kv", "flash_decoding", splits=4),
    case("split_kv", "flash_decoding", [Edit("exp2_softmax")], splits=4),
    # flash_decoding on a v5e 2x2: the plain kernel (split-KV with one split first), a kernel already
    # split within the chip in base 2, and a change of combine only
    case("chip_split", "flash_decoding", chips=4, combine="gather"),
    case("chip_split", "flash_decoding", [Edit("exp2_softmax"), Edit("split_kv", {"splits": 4})], chips=4,
         combine="separate"),
    case("chip_split", "flash_decoding", [Edit("chip_split", {"combine": "gather"})], chips=4, combine="packed"),
]


def _seed(name: str):
    return next(seed for seed, _ in seeds() if seed.name == name)


def rewrite(c: Case) -> str:
    seed = _seed(c.seed)
    task = seed.task(c.shape, **({"chips": c.chips} if c.chips > 1 else {}))
    base = replay(seed.kernel_source, c.before, task)
    assert base.status == "applied", base.reason
    result = get_operator(c.op).apply_params(base.source, task, dict(c.params))
    assert result.status == "applied", f"{c.name}: {result.status}: {result.reason}"
    assert result.edit == Edit(c.op, dict(c.params))
    return result.source


def test_case_names_are_unique():
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.name)
def test_whole_output(c):
    actual = rewrite(c)
    path = EXPECTED / f"{c.name}.py"
    if UPDATE:
        EXPECTED.mkdir(exist_ok=True)
        if not path.exists() or path.read_text() != actual:
            path.write_text(actual)
        return
    if not path.exists():
        pytest.fail(f"no expected output {path.relative_to(EXPECTED.parent)}; generate it with "
                    "UPDATE_EXPECTED=1 and read it before committing", pytrace=False)
    expected = path.read_text()
    if actual != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(keepends=True), actual.splitlines(keepends=True),
                                            f"expected/{path.name}", "actual"))
        pytest.fail(f"{c.op} output differs from expected/{path.name} "
                    f"(UPDATE_EXPECTED=1 regenerates it, on purpose):\n{diff}", pytrace=False)


def test_no_stale_expected_files():
    names = {f"{c.name}.py" for c in CASES}
    stale = sorted(p.name for p in EXPECTED.glob("*.py") if p.name not in names)
    if UPDATE:
        for name in stale:
            (EXPECTED / name).unlink()
        return
    assert not stale, f"expected files no case produces (UPDATE_EXPECTED=1 removes them): {stale}"
