"""Where each `weir.*` package lives: the folders stay on the repository's top (the layout is part of
the product's description) and import as one namespace, `weir.engine`, `weir.gateway`, ... (pyproject.toml
holds everything else; setup.py only because package_dir with found sub-packages needs code).
"""

from setuptools import find_packages, setup

FOLDERS = {
    "weir": "weir",
    "weir.engine": "engine",
    "weir.gateway": "gateway",
    "weir.kernels": "kernels",
    "weir.tenancy": "tenancy",
    "weir.migrations": "migrations",
}

packages = [
    f"{name}.{sub}" if sub else name
    for name, folder in FOLDERS.items()
    for sub in ["", *find_packages(folder)]
]
setup(packages=packages, package_dir=FOLDERS)
