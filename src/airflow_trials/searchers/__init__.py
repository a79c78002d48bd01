"""Search algorithms that wrap an optimisation library; each imports its library on first use."""
