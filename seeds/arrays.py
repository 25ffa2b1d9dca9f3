"""Arrays between the judge's processes: ``.npy`` files without pickles, bf16 stored as its uint16
bits (numpy's format has no bf16). The one codec for inputs and outputs, both ways."""

from __future__ import annotations

import numpy as np


def save_array(path, array) -> dict:
    """Write ``array``; return its dtype and shape as data for the other side."""
    array = np.asarray(array)
    dtype = str(array.dtype)
    stored = array.view(np.uint16) if dtype == "bfloat16" else array
    np.save(path, np.ascontiguousarray(stored), allow_pickle=False)
    return {"dtype": dtype, "shape": list(array.shape)}


def load_array(path, dtype: str, mapped: bool = False) -> np.ndarray:
    """Read an array written by ``save_array`` as ``dtype`` (bf16 from its bits); ``mapped``: a
    read-only map of the file, its pages the kernel's to drop (a model-sized input set)."""
    import ml_dtypes

    raw = np.load(path, allow_pickle=False, mmap_mode="r" if mapped else None)
    if dtype == "bfloat16":
        if raw.dtype != np.uint16:
            raise ValueError(f"array stored as {raw.dtype}, expected bf16 bits")
        return raw.view(ml_dtypes.bfloat16)
    return raw
