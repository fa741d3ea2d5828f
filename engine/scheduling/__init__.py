"""What runs each step: the scheduler, its waiting queue, the token budget, latency targets, the SLO tally and the stall watchdog."""
