"""Maps the top-level `passes/` and `backends/` folders to `qcc.passes` / `qcc.backends`.

pyproject.toml holds all metadata; only the package list needs code, because setuptools'
automatic discovery cannot rename folders into a namespace.
"""

from setuptools import find_packages, setup


def _mapped(folder: str) -> list[str]:
    return ["qcc." + name for name in find_packages(include=[folder, folder + ".*"])]


setup(
    packages=find_packages(include=["qcc", "qcc.*"]) + _mapped("passes") + _mapped("backends"),
    package_dir={"qcc.passes": "passes", "qcc.backends": "backends"},
    package_data={"qcc": ["py.typed"]},
)
