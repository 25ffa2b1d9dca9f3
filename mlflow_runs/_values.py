"""Turn values read back from pandas (NaN, pd.NA, NaT, numpy scalars and arrays) into plain Python."""

from __future__ import annotations

from typing import Any


def clean(value: Any) -> Any:
    """None for a missing value (None, NaN, pd.NA, NaT); plain Python otherwise."""
    import pandas as pd

    if value is None:
        return None
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    if isinstance(value, list | tuple | dict):
        return value
    try:
        return None if pd.isna(value) else value
    except (TypeError, ValueError):
        return value
