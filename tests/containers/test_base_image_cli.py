"""``crawlhub builds base-image``: the image builder's default base, built from the host's
Python with no registry; an engine that cannot run says so and the fix."""

from __future__ import annotations

import subprocess

from tests.cli.serving import crawlhub_command
from tests.containers.baseimage import ENGINE


def test_base_image_is_built_once_and_then_found_by_its_tag(base_image: str) -> None:
    done = subprocess.run([*crawlhub_command(), "builds", "base-image", "--engine", ENGINE],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert f"base image {base_image} ready" in done.stdout
    listed = subprocess.run([ENGINE, "image", "exists", base_image], check=False)
    assert listed.returncode == 0


def test_base_image_without_an_engine_fails_saying_how_to_install_one() -> None:
    done = subprocess.run([*crawlhub_command(), "builds", "base-image", "--engine",
                           "/nonexistent/podman"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert "is not installed: apt-get install -y podman runc" in done.stderr
