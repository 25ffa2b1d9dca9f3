"""The grouped matmul seed (reference.py, kernel.py)."""
