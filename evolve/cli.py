"""The `evolve` command: a table of small subcommands, each in its own module."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys

from evolve.errors import UsageError

# Modules that contribute subcommands through add_commands(subparsers).
COMMAND_MODULES = ("evolve.cli_eval", "evolve.cli_mutations", "evolve.cli_run", "evolve.cli_ablate",
                   "evolve.cli_bench", "evolve.cli_seeds")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:   # one line, exit status 2
        self.exit(2, f"evolve: error: {message} (see 'evolve --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="evolve", description="Evolutionary search for faster Pallas TPU kernels.")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.add_commands(subparsers)
    return parser


def _on_signal(signum, frame) -> None:
    """SIGTERM / SIGINT: take every sandboxed worker down first, then unwind."""
    from evaluator.sandbox import kill_all_children

    kill_all_children()
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"evolve: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        from evaluator.sandbox import kill_all_children

        kill_all_children()
        print("evolve: interrupted; every evaluation finished so far is in the archive "
              "('evolve resume RUN' continues)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
