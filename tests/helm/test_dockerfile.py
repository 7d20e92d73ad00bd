"""The Dockerfile builds the image the chart runs. No Docker engine exists on these machines, so
the image is not built here; these checks hold the Dockerfile and the chart to each other."""

from __future__ import annotations

import re

from tests.helm.chart import FULLNAME, container, one, render
from tests.support import REPO_ROOT

DOCKERFILE = (REPO_ROOT / "Dockerfile").read_text()


def test_base_image_and_cpu_torch_pin():
    assert re.search(r"^FROM python:3\.11-slim$", DOCKERFILE, flags=re.M)
    # Exactly torch 2.13.0 from the CPU index: a loose pin would pull a multi-GB CUDA build.
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in DOCKERFILE


def test_image_user_matches_the_chart_and_is_not_root():
    (user,) = re.findall(r"^USER (\d+):(\d+)$", DOCKERFILE, flags=re.M)
    assert user != ("0", "0")
    pod = one(render(), "Deployment", FULLNAME)["spec"]["template"]["spec"]["securityContext"]
    assert (str(pod["runAsUser"]), str(pod["runAsGroup"])) == user


def test_entrypoint_is_the_command_the_chart_runs():
    assert re.search(r'^ENTRYPOINT \["goodput"\]$', DOCKERFILE, flags=re.M)
    dep = one(render(), "Deployment", FULLNAME)
    assert container(dep, "sidecar")["command"] == ["goodput"]
    # Every package pyproject installs is copied into the image (`pip install .` would miss it).
    import tomllib

    include = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = [p.rstrip("*") for p in include]
    assert {"goodput_cli", "engine", "sidecar", "forecaster", "dashboards", "tracefiles"} <= set(packages)
    for package in packages:
        assert f"COPY {package} ./{package}" in DOCKERFILE


def test_the_image_builds_the_sidecars_c_fast_path():
    # The slim base has no compiler; without one `pip install .` skips sidecar/_fastrelay.c
    # (optional) and the sidecar runs its Python path. The image installs one for the build,
    # checks the path is there, and removes it again.
    assert "COPY pyproject.toml setup.py README.md ./" in DOCKERFILE
    (build,) = [step for step in DOCKERFILE.split("\nRUN ") if "pip install ." in step]
    assert "apt-get install -y --no-install-recommends gcc libc6-dev" in build
    assert build.index("gcc libc6-dev") < build.index("pip install .") < build.index("assert FAST_PATH")
    assert "apt-get purge -y --auto-remove gcc libc6-dev" in build
