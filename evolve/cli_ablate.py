"""`evolve ablate`: the one-step ablation table of the mutation operators on a task."""

from __future__ import annotations

import argparse
import json

from evolve.cli_eval import add_task_arguments, load_seed_arg, task_from_args
from evolve.errors import UsageError


def cmd_ablate(args: argparse.Namespace) -> int:
    from evaluator.judge import Judge, JudgeConfig
    from evolve.ablation import ablation_json, format_ablation, run_ablation

    task = task_from_args(args)
    seed = load_seed_arg(args.seed)
    try:
        judge = Judge(JudgeConfig(chip=args.chip, workers=args.workers or JudgeConfig().workers))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    peers = {} if args.no_jax else seed.peer_paths(ablation=True)
    rows = run_ablation(judge, seed.kernel_source, task, peers=peers)
    if args.json:
        print(json.dumps(ablation_json(rows, task, judge), indent=1))
    else:
        print(format_ablation(rows, task, judge))
    return 0


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("ablate", help="the seed, each operator alone, all together over a grid "
                                              "of knobs, and JAX's kernel")
    add_task_arguments(p)
    p.add_argument("--workers", type=int, default=0, help="parallel judges (default: one per core)")
    p.add_argument("--no-jax", "--no-peers", dest="no_jax", action="store_true",
                   help="leave the seed's outside kernels (JAX's own, for flash attention) out")
    p.add_argument("--json", action="store_true", help="print the rows as a JSON array, one object per row")
    p.set_defaults(func=cmd_ablate)
