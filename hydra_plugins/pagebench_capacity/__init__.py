"""pagebench's Hydra sweeper: the capacity search (capacity_sweeper.CapacitySweeper)."""
