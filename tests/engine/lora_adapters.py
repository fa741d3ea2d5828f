"""Make PEFT LoRA adapters for tests, and the reference: HF `generate` on the PEFT-merged model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tests.engine.tiny_models import load_hf_model

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_adapter(
    base: Path,
    out_dir: Path,
    *,
    rank: int = 8,
    alpha: float = 16.0,
    targets: Sequence[str] = ALL_TARGETS,
    seed: int = 0,
    b_std: float = 0.05,
    use_rslora: bool = False,
) -> Path:
    """Save a PEFT LoRA adapter for the model at `base` into `out_dir`, with random non-zero B
    (PEFT initialises B to zero, which would make the adapter a no-op)."""
    from peft import LoraConfig, get_peft_model

    model = load_hf_model(base)
    config = LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0, use_rslora=use_rslora
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft_model = get_peft_model(model, config)
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, b_std)
                elif "lora_A" in name:
                    param.normal_(0.0, 0.1)
    peft_model.save_pretrained(out_dir)
    return Path(out_dir)


def merged_model(base: Path, adapter: Path) -> Any:
    """The base model with the adapter merged into its weights (PEFT's merge_and_unload)."""
    from peft import PeftModel

    model = load_hf_model(base)
    return PeftModel.from_pretrained(model, adapter).merge_and_unload().eval()


def hf_greedy(model: Any, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[list[int]]:
    outs = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([list(p)])
            gen = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False
            )
            outs.append(gen[0, len(p) :].tolist())
    return outs
