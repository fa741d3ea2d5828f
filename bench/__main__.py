"""`python -m weir_bench serve|compare|gen ...`: the serving benchmark without the rest of `weir`."""

from __future__ import annotations

import sys

from weir_bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
