"""Replay an edit history onto a seed: what crossover recombines and the ablation shortens."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ._base import Edit, MutationResult

EditLike = Edit | dict[str, Any]


def replay(seed_source: str, edits: Iterable[EditLike], task: Any) -> MutationResult:
    """Apply ``edits`` in order to ``seed_source``. Never raises.

    Returns the first edit that does not apply (status ``not_applicable`` or ``failed``, with the
    source as it was before that edit and a reason naming the step), or ``applied`` with the final
    source and the last edit (``edit`` is None for an empty history).
    """
    from .registry import get_operator

    source = seed_source
    last: Edit | None = None
    count = 0
    for step, item in enumerate(edits):
        try:
            edit = item if isinstance(item, Edit) else Edit.from_dict(item)
            op = get_operator(edit.op)
        except (KeyError, TypeError, ValueError) as exc:
            return MutationResult("failed", source, None, f"edit {step}: {exc}")
        result = op.apply_params(source, task, dict(edit.params))
        if result.status != "applied":
            return MutationResult(result.status, source, edit,
                                  f"edit {step} ({edit.op} {edit.params}): {result.reason}")
        source, last, count = result.source, edit, count + 1
    return MutationResult("applied", source, last, f"replayed {count} edit(s)")


def replay_applicable(seed_source: str, edits: Iterable[EditLike], task: Any) -> tuple[str, list[EditLike]]:
    """Apply ``edits`` in order to ``seed_source``, dropping each that does not apply or changes
    nothing, and go on with the rest. Never raises.

    Returns the final source and the edits kept, as given (``Edit`` or dict): a recombined or
    shortened history whose edits all did something, so it replays with :func:`replay`.
    """
    source, kept = seed_source, []
    for edit in edits:
        result = replay(source, [edit], task)
        if result.applied and result.source != source:
            source, kept = result.source, kept + [edit]
    return source, kept
