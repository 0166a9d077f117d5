"""Package discovery that pyproject.toml alone cannot express.

The bundled recipes live in the top-level recipes/ folder (TOML only, no __init__.py) and ship
inside the package as `ditty.bundled_recipes`, so `ditty ls` works after a plain `pip install`.
`packages.find` cannot discover a mapped folder, so the package list is assembled here.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["ditty", "ditty.*"]) + ["ditty.bundled_recipes"],
    package_dir={"ditty.bundled_recipes": "recipes"},
    package_data={"ditty.bundled_recipes": ["*.toml"]},
)
