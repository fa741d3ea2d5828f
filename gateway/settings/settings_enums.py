"""The settings whose values are one of a few names: the enums of `weir serve`'s settings.

Settings that are on or off are booleans (gateway/settings/settings_parsing.py's `parse_bool` reads
`on`/`off`, `true`/`false`, `1`/`0`); the enums here name more than two choices, or AUTO beside
ON and OFF.
"""

from __future__ import annotations

import enum
from typing import Literal, get_args

Dtype = Literal["float32", "float16", "bfloat16"]
DTYPES: tuple[str, ...] = get_args(Dtype)


class OtelExporter(enum.Enum):
    """Where finished trace spans go."""

    NONE = "none"
    CONSOLE = "console"
    OTLP = "otlp"


class AuthMode(enum.Enum):
    """How callers are identified. NONE serves every request as the `default` tenant."""

    KEYS = "keys"
    NONE = "none"


class AttentionBackend(enum.Enum):
    """AUTO: Triton on CUDA, torch elsewhere. TRITON needs CUDA (refused at start-up without it)."""

    AUTO = "auto"
    TORCH = "torch"
    TRITON = "triton"


class CudaGraphsMode(enum.Enum):
    """AUTO: capture decode graphs on CUDA with the Triton path. ON needs both (refused without)."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


class CpuRowWeightsMode(enum.Enum):
    """AUTO: on CPU in float32 with the packed linears, keep a second copy of every linear weight
    for decode steps of few rows where a start-up measurement finds it faster, for the row counts
    it is (engine/models/packed_linear.py, row_weight_probe.py; twice the linear weights'
    memory). ON: the copy for one-row steps, not measured; it needs that path (refused
    elsewhere). OFF saves the memory."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


class LogLevel(enum.Enum):
    """Log levels, named as uvicorn and `logging` name them."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
