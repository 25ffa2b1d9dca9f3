"""The sparse mixture-of-experts seed (reference.py, kernel.py)."""
