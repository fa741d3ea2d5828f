"""Whether a request runs now: budgets, SLO prediction, and settling what it used."""
