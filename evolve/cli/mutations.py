"""The ``evolve ops`` and ``evolve mutate`` commands (mutation operators on kernel sources).

The main CLI takes them from ``COMMANDS`` (``cli.common.add_command`` adds one to any argparse
subparsers object; each sets ``func(args) -> int``, the exit status).
"""

from __future__ import annotations

import argparse
import difflib
import random
import sys
from pathlib import Path

from evolve.cli.common import Command


def _error(message: str) -> int:
    print(f"evolve: error: {message}", file=sys.stderr)
    return 2


class OpsCommand(Command):
    name = "ops"
    help = "list the mutation operators"
    description = "List the mutation operators with their descriptions."

    def take_action(self, args: argparse.Namespace) -> int:
        from mutations import all_operators

        operators = all_operators()
        width = max(len(op.name) for op in operators)
        for op in operators:
            print(f"{op.name:<{width}}  {op.description}")
        return 0


class MutateCommand(Command):
    name = "mutate"
    help = "apply mutation operators to a kernel source and print the diff"
    description = ("Apply mutation operators in order to a kernel source; print the unified diff "
                   "(or write the result with --out). Exit 2 when an operator does not apply.")
    parents = ("task", "start")   # the task the preconditions check against; the kernel

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("path", metavar="PATH", nargs="?", default=None,
                            help="kernel source file (e.g. seeds/flash_attention/kernel.py); or name the "
                                 "kernel with --start")
        parser.add_argument("--op", dest="ops", action="append", required=True, metavar="NAME",
                            help="operator to apply (repeatable; applied in order); see 'evolve ops'")
        parser.add_argument("--rng-seed", type=int, default=0, metavar="N",
                            help="seed of the random.Random the operators draw parameters from (default 0)")
        parser.add_argument("--out", metavar="FILE", help="write the rewritten source here instead of a diff")

    def take_action(self, args: argparse.Namespace) -> int:
        # Errors are returned, not raised: this command also runs outside evolve.cli.main.
        from evolve.cli.eval import seed_from_args, start_from_args, task_from_args
        from evolve.errors import UsageError
        from mutations import get_operator

        try:
            operators = [get_operator(name) for name in args.ops]
        except KeyError as exc:
            return _error(str(exc.args[0]))
        if not args.path and not args.start:
            return _error("a kernel is required: give a kernel file PATH or --start MODULE_OR_FILE")
        if args.path:
            try:
                Path(args.path).read_text()
            except (OSError, UnicodeDecodeError) as exc:
                return _error(f"cannot read {args.path}: {getattr(exc, 'strerror', None) or exc}")
        try:
            task = task_from_args(args, path=args.path)
            start = start_from_args(args, seed_from_args(args), args.path).for_task(task)
        except UsageError as exc:
            return _error(str(exc))
        original = start.source
        path = Path(args.path) if args.path else Path(start.name.replace(".", "/") + ".py"
                                                      if start.kind == "module" else start.path)

        rng = random.Random(args.rng_seed)
        source = original
        for op in operators:
            result = op.apply(source, task, rng)
            if result.status != "applied":
                what = "does not apply" if result.status == "not_applicable" else "failed"
                print(f"{op.name}: {what}: {result.reason}", file=sys.stderr)
                return 2
            print(f"{op.name}: applied {result.edit.to_json() if result.edit else ''}", file=sys.stderr)
            source = result.source

        if args.out:
            try:
                Path(args.out).write_text(source)
            except OSError as exc:
                return _error(f"cannot write {args.out}: {exc.strerror or exc}")
            return 0
        sys.stdout.writelines(difflib.unified_diff(
            original.splitlines(keepends=True), source.splitlines(keepends=True),
            fromfile=f"a/{path}", tofile=f"b/{path}"))
        return 0


COMMANDS = (OpsCommand, MutateCommand)
