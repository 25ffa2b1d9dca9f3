"""`evolve ablate`: the one-step ablation table of the mutation operators on a task."""

from __future__ import annotations

import argparse

from evolve.cli.common import Command, add_json_alias, print_json, seed_timing
from evolve.cli.eval import check_tiling, seed_from_args, start_from_args, task_from_args
from evolve.errors import UsageError


class AblateCommand(Command):
    name = "ablate"
    help = "the seed, each operator alone, all together over a grid of knobs, and JAX's kernel"
    parents = ("format", "task", "executor", "start")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--no-jax", "--no-peers", dest="no_jax", action="store_true",
                            help="leave the seed's outside kernels (JAX's own, for flash attention) out")
        add_json_alias(parser, help="print the rows as a JSON array, one object per row (the same as "
                                    "--format json)")

    def take_action(self, args: argparse.Namespace) -> int:
        from evaluator import Judge
        from evolve.experiments.ablation import ablation_json, format_ablation, run_ablation
        from evolve.config import JudgeSettings
        from evolve.executors.base import open_executor

        task = task_from_args(args)
        seed = seed_from_args(args)
        start = start_from_args(args, seed).for_task(task)
        check_tiling(start.source, task)
        settings = JudgeSettings(chip=args.chip, workers=args.workers or 0, executor=args.executor or "local",
                                 ray_address=args.ray_address or "", timing=seed_timing(seed) or "auto")
        try:
            judge = Judge(settings.judge_config())
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        peers = {} if args.no_jax else seed.peer_paths(ablation=True)
        with open_executor(settings) as executor:
            rows = run_ablation(judge, start.source, task, peers=peers, executor=executor)
        if args.format == "json":     # every row names the kernel the ablation started from
            print_json([{**row, "start": start.label} for row in ablation_json(rows, task, judge)])
        else:
            print(f"start ('seed' below): {start.label}\n" + format_ablation(rows, task, judge))
        return 0


COMMANDS = (AblateCommand,)
