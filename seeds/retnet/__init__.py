"""The RetNet retention seed: its task is reference.py (create_inputs, workload), its kernel kernel.py."""
