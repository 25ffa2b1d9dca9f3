"""pallas-evolve: mutations."""
