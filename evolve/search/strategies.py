"""Search strategies, side by side: the same loop, judge and archive; only how a child is bred
differs. Each is a ``Search`` (evolve/search/loop.py) overriding the first population and
``breed_one``, so every strategy runs steady-state on the same executor, takes results in the same
order and meets the same budget of distinct kernels.

* ``ga``: the DEAP search (tournament selection, crossover, operator chains drawn by payoff, the
  surrogate ranking oversampled children, a hall of fame).
* ``ratchet``: the Ratchet Loop's greedy climb: one change to the best kernel so far, kept only if
  it is faster. With more than one worker, child i changes the best as of item i - lag.
* ``random``: random edit chains (1..max_chain + 2 operators, drawn uniformly) from the seed.
"""

from __future__ import annotations

import random

from seeds import Registry
from evolve.errors import UsageError
from evolve.search.individual import Individual
from evolve.search.loop import Search, item_rng


class _FromSeed(Search):
    """Strategies that start from the seed alone."""

    def initial_population(self) -> list[Individual]:
        seed = Individual(self.seed_source, edits=[], generation=0)
        self.seen = {seed.id}
        return [seed]

    def _new_child(self, parent: Individual, index: int, generation: int, max_chain: int) -> Individual | None:
        rng = random.Random(item_rng(self.config.search.rng_seed, index))
        for _ in range(self.config.search.max_tries):
            child = self.toolbox.mutate(parent, rng=rng, generation=generation, max_chain=max_chain)
            if child is not None and child.id not in self.seen:
                child.cut = self.cut()
                self.seen.add(child.id)
                return child
        return None


class Ratchet(_FromSeed):
    def breed_one(self, index: int, generation: int) -> Individual | None:
        parent = self.champion if self.champion is not None else self.taken[0]
        return self._new_child(parent, index, generation, max_chain=1)


class RandomSearch(_FromSeed):
    def breed_one(self, index: int, generation: int) -> Individual | None:
        return self._new_child(self.taken[0], index, generation, max_chain=self.config.search.max_chain + 2)


# A family (seeds/registry.py): built-ins here, others by the entry-point group pallas_evolve.strategies.
STRATEGIES = Registry("strategies", {"ga": "evolve.search.loop:Search", "ratchet": "evolve.search.strategies:Ratchet",
                                     "random": "evolve.search.strategies:RandomSearch"}, member="strategy")


def strategy_class(name: str) -> type[Search]:
    if name not in STRATEGIES:
        raise UsageError(f"unknown strategy {name!r}; use one or more of: {', '.join(STRATEGIES.names())}")
    return STRATEGIES.load(name)
