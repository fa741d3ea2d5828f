"""What may be called: model versions and LoRA adapters, their records and repositories, and the rollout guards."""
