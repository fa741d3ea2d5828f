"""The model versions (and LoRA adapters) one server runs, how traffic is split between them, rollouts."""
