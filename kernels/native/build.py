"""Compiling this folder's C kernels once per process and loading them with ctypes.

The CPU path's hand-written kernels are plain C (no torch headers: a torch extension takes
tens of seconds to build, this ~0.5 s), compiled with the machine's `cc` for its own CPU
(`-march=native`) into a private temporary folder the first time a kernel is asked for, and
loaded with `ctypes.CDLL`, whose calls release the GIL. Where there is no compiler, or the
build or load fails, `load` returns None after one warning and callers keep their torch path:
a missing compiler costs speed, never a request.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parent
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-fno-math-errno")
COMPILE_TIMEOUT_S = 120


class NativeBuildError(RuntimeError):
    """A C kernel could not be compiled or loaded."""


def compiler() -> str | None:
    """The C compiler on PATH (`cc`, else `gcc`), or None."""
    return shutil.which("cc") or shutil.which("gcc")


def build(name: str, out_dir: Path) -> Path:
    """Compile `<name>.c` of this folder into `out_dir/lib<name>.so`; NativeBuildError on failure."""
    cc = compiler()
    if cc is None:
        raise NativeBuildError("no C compiler (cc or gcc) on PATH")
    source = SOURCE_DIR / f"{name}.c"
    target = out_dir / f"lib{name}.so"
    try:
        done = subprocess.run(
            [cc, *FLAGS, "-o", str(target), str(source), "-lm"],
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NativeBuildError(f"{cc} on {source.name}: {exc}") from exc
    if done.returncode != 0:
        raise NativeBuildError(f"{cc} on {source.name} failed: {done.stderr.strip()[-2000:]}")
    return target


@functools.cache
def load(name: str) -> ctypes.CDLL | None:
    """The compiled `<name>.c` of this folder, built on first use; None (warned once) if it cannot be."""
    out_dir = Path(tempfile.mkdtemp(prefix="weir-kernels-"))
    try:
        return ctypes.CDLL(str(build(name, out_dir)))
    except (NativeBuildError, OSError) as exc:
        logger.warning("C kernel %s unavailable, the torch path is used instead: %s", name, exc)
        return None
    finally:
        # The loaded library stays mapped; its file is not needed once loaded (or on failure).
        shutil.rmtree(out_dir, ignore_errors=True)


def function(name: str, symbol: str, argtypes: Sequence[Any]) -> Any | None:
    """`symbol` of the compiled `<name>.c` (built on first use), with its C argument types and an
    `int` status as its result; None where the library cannot be built (warned once by `load`)."""
    lib = load(name)
    if lib is None:
        return None
    fn = getattr(lib, symbol)
    fn.argtypes = list(argtypes)
    fn.restype = ctypes.c_int
    return fn


def address(name: str, symbol: str) -> int | None:
    """The address of `symbol` in the compiled `<name>.c` (built on first use), to hand to another
    kernel as a function pointer; None where the library cannot be built (warned once by `load`)."""
    lib = load(name)
    if lib is None:
        return None
    return ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value
