"""Correctness: whether the kernel computes the task, on inputs it cannot know.

Each judge draws its input sets in secret (``ground_truth``); the trusted runner runs the
candidate in Pallas' interpret mode on the CPU under a grid loop that shows a kernel only what a
TPU's pipeline would (``interpret``), a per-chip kernel through its mesh harness (``mesh``); the
output is held against the f32 truth within tolerances no looser than the task's own XLA program
(``compare``, ``verdicts``), whose figure and outputs ``reference`` computes and caches. If "a
wrong kernel passed" or "a right one failed", look here. Trusts: the task's reference and its own
draws; never the candidate.
"""
