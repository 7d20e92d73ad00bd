"""The one compiled part: the measured path's per-token step in C (sidecar/_fastrelay.c).

Optional: where no C compiler is found the package installs without it and the sidecar runs the
same path in Python (sidecar.upstream.FAST_PATH says which). Everything else is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("sidecar._fastrelay", ["sidecar/_fastrelay.c"], optional=True)])
