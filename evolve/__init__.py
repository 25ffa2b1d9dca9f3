"""pallas-evolve: evolve."""
