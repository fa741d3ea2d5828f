"""How much a caller may spend: quotas, leases across replicas, budget windows and window budgets, prices, money."""
