"""Variation: mutation by one applicable operator, crossover by replaying two edit histories."""

from __future__ import annotations

import random
from typing import Any

from evolve.individual import Individual
from mutations import Edit, all_operators, replay


def mutate(parent: Individual, seed_source: str, task: Any, rng: random.Random,
           generation: int) -> Individual | None:
    """Apply one operator, chosen among those that apply, with parameters from ``rng``."""
    operators = [op for op in all_operators() if op.check(parent.source, task)]
    rng.shuffle(operators)
    for op in operators:
        result = op.apply(parent.source, task, rng)
        if result.applied and result.source != parent.source and result.edit is not None:
            edit = result.edit.to_dict()
            return Individual(result.source, edits=parent.edits + [edit], parent_ids=(parent.id,),
                              operator=op.name, params=dict(result.edit.params), generation=generation)
    return None


def crossover(a: Individual, b: Individual, seed_source: str, task: Any, rng: random.Random,
              generation: int) -> Individual | None:
    """One-point crossover of two edit histories, replayed on the seed; edits that no longer
    apply are dropped. The child records both parents."""
    cut_a = rng.randint(0, len(a.edits))
    cut_b = rng.randint(0, len(b.edits))
    proposal = a.edits[:cut_a] + b.edits[cut_b:]
    source, kept = seed_source, []
    for edit in proposal:
        result = replay(source, [Edit.from_dict(edit)], task)
        if result.applied and result.source != source:
            source = result.source
            kept.append(edit)
    if source in (a.source, b.source) or not kept:
        return None
    return Individual(source, edits=kept, parent_ids=(a.id, b.id), operator="crossover",
                      params={"cut_a": cut_a, "cut_b": cut_b}, generation=generation)
