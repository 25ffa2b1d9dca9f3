"""Experiments on the search itself: strategies side by side (bench), a suite of tasks, a one-step
ablation, where a run's time went (stages) and the decode benchmark."""
