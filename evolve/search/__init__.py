"""The search: which kernel is bred next and which survives. The loop (DEAP's toolbox, tournament
selection, the hall of fame), variation, the individual, the surrogate and the other strategies."""
