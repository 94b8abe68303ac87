"""List the packages under the mlsyskit namespace; pyproject.toml maps core/ and tools/ to them."""
from setuptools import find_packages, setup

setup(packages=[f"mlsyskit.{top}{'.' + sub if sub else ''}" for top in ("core", "tools")
                for sub in ["", *find_packages(top)]])
