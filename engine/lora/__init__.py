"""LoRA adapters: reading PEFT folders, the adapter manager and its device slots, the shared torch-free types."""
