"""LoRA adapters: reading PEFT folders, the adapter manager and its device slots, the per-step deltas the model adds, the shared torch-free types."""
