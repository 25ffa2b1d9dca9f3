"""`evolve seeds`: the built-in seeds, each with what it computes and its default task."""

from __future__ import annotations

import argparse

from evolve.cli.common import Command


class SeedsCommand(Command):
    name = "seeds"
    help = "list the seeds known by name (built in, or from installed packages) and their default tasks"

    def take_action(self, args: argparse.Namespace) -> int:
        from evolve.start.resolve import declared_starts, installed_version
        from seeds import builtin_seeds, load_seed
        from seeds import ReferenceSeed

        for name in builtin_seeds():
            seed = load_seed(name)
            task = seed.default_task()
            print(f"{name}\n  {seed.description}\n  default task: {task.key}\n"
                  f"  --shape grammar: {task.shape_grammar or '(none)'}; entry point: "
                  f"{task.entry}({', '.join(task.input_names)}, ...)\n"
                  f"  directory: {seed.directory}"
                  + ("  (task: reference.py)" if isinstance(seed, ReferenceSeed) else ""))
            for short, module in declared_starts(seed).items():
                distribution, version = installed_version(module)
                where = f"{distribution} {version} installed" if distribution else "not installed"
                print(f"  start {short}: {module} ({where}); --start {short}")
        print("\nA run may start from any other kernel too: --start MODULE_OR_FILE (an importable module, "
              "read from its installed package, or a file); the seed's task judges it.")
        print("Any other seed: a directory with task.py (or reference.py) and kernel.py, passed as --seed PATH "
              "(see 'The seed contract' in the README); or any kernel with a reference file: "
              "--reference R.py --start K.py.")
        return 0


COMMANDS = (SeedsCommand,)
