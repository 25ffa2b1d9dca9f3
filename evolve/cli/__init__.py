"""The `evolve` command: a table of small command classes (evolve.cli.common.Command), one module
per family of commands; each module lists its commands in COMMANDS."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys

from evolve.cli.common import Command, add_command, shared_parents
from evolve.errors import UsageError

# Modules that contribute commands through their COMMANDS tuple.
COMMAND_MODULES = ("evolve.cli.eval", "evolve.cli.mutations", "evolve.cli.run", "evolve.cli.lineage",
                   "evolve.cli.ablate", "evolve.cli.bench", "evolve.cli.seeds", "evolve.cli.decode_bench")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:   # one line, exit status 2
        self.exit(2, f"evolve: error: {message} (see 'evolve --help')\n")


def command_table() -> dict[str, type[Command]]:
    """Every command by name, in the order of COMMAND_MODULES (a module that cannot be imported
    because it is absent is left out)."""
    table: dict[str, type[Command]] = {}
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        for command in module.COMMANDS:
            if command.name in table:
                raise RuntimeError(f"two commands named {command.name!r}: {table[command.name].__qualname__} "
                                   f"and {command.__qualname__}")
            table[command.name] = command
    return table


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="evolve", description="Evolutionary search for faster Pallas TPU kernels.")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    parents = shared_parents()
    for command in command_table().values():
        add_command(subparsers, command, parents)
    return parser


def _on_signal(signum, frame) -> None:
    """SIGTERM / SIGINT: take every sandboxed worker down first, then unwind."""
    from evaluator import kill_all_children

    kill_all_children()
    raise KeyboardInterrupt


def execute(args: argparse.Namespace) -> int:
    """Run parsed arguments' command: its exit status, or 2 with one line for bad input."""
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"evolve: error: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        return execute(args)
    except KeyboardInterrupt:
        from evaluator import kill_all_children

        kill_all_children()
        print("evolve: interrupted; every evaluation finished so far is in the archive "
              "('evolve resume RUN' continues)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
