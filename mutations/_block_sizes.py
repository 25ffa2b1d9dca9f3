"""Block sizes: move one block-size tunable to another legal value (knows nothing about speed)."""

from __future__ import annotations

import random
from typing import Any

import libcst as cst

from ._base import APPLICABLE, Applicability, NotApplicable, Operator
from ._tunables import module_ints, set_tunable

SEQ_TILE = 128          # sequence blocks are multiples of the 128-lane tile
MAX_SEQ_BLOCK = 2048    # beyond this a block's f32 logits alone no longer fit scoped VMEM
MAX_HEADS_PER_PROGRAM = 8


def legal_values(name: str, task: Any) -> list[int]:
    """Legal values of a block tunable for the task, ascending."""
    if name in ("BLOCK_Q", "BLOCK_KV"):
        n = task.seq_len
        return [v for v in range(SEQ_TILE, min(n, MAX_SEQ_BLOCK) + 1, SEQ_TILE) if n % v == 0]
    if name == "HEADS_PER_PROGRAM":
        return [v for v in range(1, min(task.heads, MAX_HEADS_PER_PROGRAM) + 1) if task.heads % v == 0]
    return []


class BlockSizes(Operator):
    name = "block_sizes"
    description = ("Move one block-size tunable (BLOCK_Q, BLOCK_KV, HEADS_PER_PROGRAM) to another "
                   "legal value: a multiple of 128 dividing N, or a divisor of H.")

    def _choices(self, module: cst.Module, task: Any) -> dict[str, list[int]]:
        ints = module_ints(module)
        out = {}
        for name in ("BLOCK_Q", "BLOCK_KV", "HEADS_PER_PROGRAM"):
            if name in ints:
                values = [v for v in legal_values(name, task) if v != ints[name]]
                if values:
                    out[name] = values
        return out

    def _check(self, module, task) -> Applicability:
        ints = module_ints(module)
        present = [n for n in ("BLOCK_Q", "BLOCK_KV", "HEADS_PER_PROGRAM") if n in ints]
        if not present:
            return Applicability(False, "no BLOCK_Q / BLOCK_KV / HEADS_PER_PROGRAM module constant")
        if not self._choices(module, task):
            return Applicability(False, f"no other legal value for {', '.join(present)} at "
                                        f"N={task.seq_len}, H={task.heads} (sequence blocks must be "
                                        f"multiples of {SEQ_TILE} dividing N)")
        return APPLICABLE

    def _sample(self, module, task, rng: random.Random) -> dict[str, Any]:
        choices = self._choices(module, task)
        name = rng.choice(sorted(choices))
        return {"tunable": name, "value": rng.choice(choices[name])}

    def _rewrite(self, module, task, params) -> cst.Module:
        name, value = params.get("tunable"), params.get("value")
        ints = module_ints(module)
        if name not in ints:
            raise NotApplicable(f"the source has no tunable {name!r}")
        if not isinstance(value, int) or value not in legal_values(name, task):
            raise NotApplicable(f"{name}={value!r} is not legal for N={task.seq_len}, H={task.heads}: "
                                f"legal values are {legal_values(name, task)}")
        return set_tunable(module, name, str(value))
