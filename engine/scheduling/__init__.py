"""What runs each step: the scheduler, its waiting queue, the token budget, the speculation policy, the SLO tally and the stall watchdog."""
