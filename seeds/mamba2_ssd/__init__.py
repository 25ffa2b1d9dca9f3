"""The Mamba-2 SSD seed: its task is reference.py (create_inputs, workload), its kernel kernel.py."""
