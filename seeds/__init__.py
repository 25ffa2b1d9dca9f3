"""pallas-evolve: seeds. Each is a directory (``task.py`` + ``kernel.py``); see ``_contract``."""

from seeds._contract import (WIDE, WIDE_FACTORS, SeedError, Seed, SeedTask, builtin_seeds, check_positive_ints,
                             load_seed, parse_shape, task_from_source, task_source, wide_attention, wide_factor,
                             widened)

__all__ = ["WIDE", "WIDE_FACTORS", "Seed", "SeedError", "SeedTask", "builtin_seeds", "check_positive_ints",
           "load_seed", "parse_shape", "task_from_source", "task_source", "wide_attention", "wide_factor", "widened"]
