"""CPU kernels in C, compiled on the machine that runs them (see `build.py`)."""
