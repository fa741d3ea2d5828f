"""How much a caller may spend: quotas and their limits, leases across replicas, budget windows and window budgets, prices, money, spend operations."""
