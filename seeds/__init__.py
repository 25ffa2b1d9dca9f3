"""pallas-evolve: seeds."""
