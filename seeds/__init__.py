"""pallas-evolve: seeds, the bottom layer. Each seed is a directory (``task.py`` + ``kernel.py``, see
``_contract``) or a reference file's (``reference.py``); this module is the package's public face:
every other package imports from here, never from a ``_private`` module."""

from seeds._contract import (WIDE, WIDE_FACTORS, SeedError, Seed, SeedTask, check_positive_ints, parse_shape,
                             wide_attention, wide_factor, widened)
from seeds._loading import SEEDS, builtin_seeds, load_seed, task_class_from_source, task_from_source, task_source
from seeds.arrays import load_array, save_array
from seeds.entries import ReferenceError, kernel_entry
from seeds.reference import ReferenceSeed, reference_seed
from seeds.registry import Registry

__all__ = ["SEEDS", "WIDE", "WIDE_FACTORS", "ReferenceError", "ReferenceSeed", "Registry", "Seed", "SeedError",
           "SeedTask", "builtin_seeds", "check_positive_ints", "kernel_entry", "load_array", "load_seed",
           "parse_shape", "reference_seed", "save_array", "task_class_from_source", "task_from_source",
           "task_source", "wide_attention", "wide_factor", "widened"]
