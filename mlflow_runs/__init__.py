"""pallas-evolve: mlflow_runs."""
