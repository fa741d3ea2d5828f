"""The `weir` command: the composition root over gateway, tenancy, engine and (lazily) bench."""

# The repository root goes last on sys.path. It is there when Weir runs from a checkout (pytest's
# rootdir, `python -m weir.cli` or `python -m tests...` from the root), and its folders (engine/,
# kernels/, ...) would shadow installed top-level packages of the same names: Hugging Face's
# `kernels`, which transformers imports. Weir itself imports as weir.* from its installed
# (editable) distribution; only `tests` is found through the root. tests/ and bench/ import this
# package first for the same reason.
import os as _os
import sys as _sys

_ROOT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_ROOT, "pyproject.toml")):  # a checkout, not site-packages
    _sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or _os.curdir) != _ROOT] + [_ROOT]
