"""The settings of the work before a prompt reaches the engine: input bounds checked before any
template runs, the tokenizer threads and their share per tenant, and grammar compiles."""

from __future__ import annotations

from pydantic.dataclasses import dataclass

from weir.gateway.settings.setting_field import setting

# Messages in one chat, and content parts across them: the default of `--max-chat-messages`.
DEFAULT_MAX_CHAT_MESSAGES = 2048


@dataclass(frozen=True)
class PromptFields:
    """Prompts: bounds, tokenizer threads and grammar compiles

    (weir.gateway.prompts.prompt_limits, tokenizer_pool and grammar)
    """

    max_chat_messages: int = setting(
        DEFAULT_MAX_CHAT_MESSAGES,
        "messages in one chat, and content parts across them, refused above this before any template runs",
        doc="messages in one chat, and content parts across them; more: `400 too_many_messages`, counted "
        "before any message is read or rendered",
        metavar="N",
        ge=1,
    )
    # None: the model's longest token (no token covers more characters, for byte-level BPE).
    prompt_chars_per_token: int | None = setting(
        None,
        "a text prompt longer than N x the context in characters is refused untokenized",
        doc="a text whose characters, divided by this, already reach the context (or the request's "
        "prompt-token bound) is refused untokenized (`400 prompt_too_long`); the default never refuses "
        "what would fit with a byte-level BPE tokenizer; lower it to refuse text that packs more "
        "characters into its tokens",
        default_text="the model's longest token (81 for SmolLM2)",
        metavar="N",
        ge=1,
    )
    tokenizer_workers: int = setting(
        4,
        "threads that render chat templates and tokenize prompts",
        doc="threads that render chat templates, tokenize prompts and check token ids, each with its own "
        "tokenizer copy (made when the model version loads, before it serves, with two more for the "
        "prefix-cache routes' text encoding); only prompts within `--tokenizer-inline-bytes` run on the "
        "event loop",
        metavar="N",
        ge=1,
    )
    tokenizer_tenant_share: float = setting(
        0.5,
        "most of the tokenizer threads (0-1] one tenant may hold at once",
        doc="most of the tokenizer threads (at least one) one tenant holds at once; its further prompts "
        "wait behind its own, and a freed thread goes to the tenants in turn",
        metavar="F",
        gt=0,
        le=1,
    )
    tokenizer_inline_bytes: int = setting(
        512,
        "a prompt of at most N UTF-8 bytes (and 8 messages or prompts) is tokenized on the event loop, "
        "not a tokenizer thread; 0: none",
        doc="a chat or completion prompt of at most this many UTF-8 bytes (and at most 8 messages or "
        "prompts, no earlier tool calls) is tokenized on the event loop with a tokenizer copy of its own, "
        "~0.05-0.3 ms of loop time, instead of on a tokenizer thread, whose hand-off costs more server "
        "CPU than the work; `0`: every prompt on a thread",
        metavar="N",
        ge=0,
    )
    grammar_compile_timeout_s: float = setting(
        5.0,
        "a structured-output or tool grammar that does not compile within S seconds is refused with 400",
        metavar="S",
        gt=0,
    )
    grammar_compile_workers: int = setting(2, "worker threads that compile grammars", metavar="N", ge=1)
    grammar_mask_workers: int = setting(
        2,
        "worker threads that compute constrained requests' next-token masks ahead of each step",
        doc="worker threads (lowest CPU priority) that compute constrained requests' next-token masks while "
        "the step's forward runs, shared fairly between tenants (engine/structured/mask_pool.py)",
        metavar="N",
        ge=1,
        le=64,
    )
    grammar_mask_extra_workers: int = setting(
        6,
        "mask threads started beyond the workers for a tenant with no mask running while others' hold them all",
        doc="mask threads the pool may start beyond `--grammar-mask-workers`, each for a tenant with no mask "
        "running while other tenants' slow masks hold every worker (they end when idle)",
        metavar="N",
        ge=0,
        le=256,
    )
    grammar_mask_timeout_s: float = setting(
        5.0,
        "a constrained request whose next-token mask runs past S seconds fails alone with grammar_timeout",
        doc="a constrained request whose next mask has been computing this long on a worker fails alone "
        "(`grammar_timeout`, its blocks freed); time spent waiting for a worker is not counted (a mask "
        "that never gets one fails after 6x this)",
        metavar="S",
        gt=0,
        le=600,
    )
