"""evolve ops / evolve mutate, through a parser of our own (the main CLI adds the same commands)."""

from __future__ import annotations

import argparse

import pytest

from evolve.cli import mutations as cli_mutations
from evolve.cli.common import add_command
from mutations import all_operators, read_tunables

from .kernel_check import SEED_PATH


def run(argv, capsys):
    parser = argparse.ArgumentParser(prog="evolve")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for command in cli_mutations.COMMANDS:
        add_command(subparsers, command)
    args = parser.parse_args(argv)
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_ops_lists_every_operator(capsys):
    code, out, _ = run(["ops"], capsys)
    assert code == 0
    for op in all_operators():
        assert any(line.startswith(op.name) and op.description in line for line in out.splitlines())


def test_mutate_prints_a_unified_diff(capsys):
    code, out, _ = run(["mutate", str(SEED_PATH), "--op", "deferred_norm", "--op", "compact_scratch",
                        "--shape", "B=1,H=2,N=256,D=128"], capsys)
    assert code == 0
    assert out.startswith("--- a/") and "\n+++ b/" in out
    assert "-    l_next_inv = 1.0 / l_next\n" in out
    assert "+    acc_scratch[...] = acc_scratch[...] * alpha + pv\n" in out


def test_mutate_writes_the_result_and_is_seeded(capsys, tmp_path):
    outs = []
    for name in ("a.py", "b.py"):
        target = tmp_path / name
        code, out, _ = run(["mutate", str(SEED_PATH), "--op", "block_sizes", "--op", "vmem_limit",
                            "--rng-seed", "3", "--out", str(target)], capsys)
        assert code == 0 and out == ""
        outs.append(target.read_text())
    assert outs[0] == outs[1]
    assert "VMEM_LIMIT_BYTES" in read_tunables(outs[0])


def test_mutate_not_applicable_exits_2_with_one_line(capsys):
    code, out, err = run(["mutate", str(SEED_PATH), "--op", "causal_skip", "--no-causal"], capsys)
    assert code == 2 and out == ""
    assert err.strip().count("\n") == 0 and "causal_skip" in err and "not causal" in err


@pytest.mark.parametrize("argv, needle", [
    (["mutate", "/nonexistent/kernel.py", "--op", "deferred_norm"], "cannot read"),
    (["mutate", str(SEED_PATH), "--op", "warp_drive"], "unknown operator"),
    (["mutate", str(SEED_PATH), "--op", "deferred_norm", "--shape", "Q=3"], "bad shape"),
])
def test_mutate_errors_exit_2_with_one_line(capsys, argv, needle):
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert err.strip().count("\n") == 0 and needle in err
