"""`evolve seeds`: the built-in seeds, each with what it computes and its default task."""

from __future__ import annotations

import argparse

from evolve.cli_common import Command


class SeedsCommand(Command):
    name = "seeds"
    help = "list the seeds known by name (built in, or from installed packages) and their default tasks"

    def take_action(self, args: argparse.Namespace) -> int:
        from seeds import builtin_seeds, load_seed

        for name in builtin_seeds():
            seed = load_seed(name)
            task = seed.default_task()
            print(f"{name}\n  {seed.description}\n  default task: {task.key}\n"
                  f"  --shape grammar: {seed.task_class.shape_grammar}; entry point: "
                  f"{seed.task_class.entry}({', '.join(seed.task_class.input_names)}, ...)\n"
                  f"  directory: {seed.directory}")
        print("\nAny other seed: a directory with task.py and kernel.py, passed as --seed PATH "
              "(see 'The seed contract' in the README).")
        return 0


COMMANDS = (SeedsCommand,)
