"""The container tests' base image: the product's recipe
(:mod:`crawlhub.control.builders.baseimage`, ``crawlhub builds base-image``) with the
engine the tests use (``$CRAWLHUB_TEST_ENGINE``, default podman).

    python tests/containers/baseimage.py        # builds it unless it exists (.ci/run)
"""

from __future__ import annotations

import os
import sys
import time

from crawlhub.control.builders import baseimage
from crawlhub.control.builders.baseimage import BASE_IMAGE, NoEngine, engine_problem

ENGINE = os.environ.get("CRAWLHUB_TEST_ENGINE", "podman")

__all__ = ["BASE_IMAGE", "ENGINE", "NoEngine", "engine_problem", "ensure_base_image"]


def ensure_base_image(tag: str = BASE_IMAGE, engine: str = ENGINE) -> str:
    """:func:`crawlhub.control.builders.baseimage.ensure_base_image` on the tests' engine."""
    return baseimage.ensure_base_image(tag, engine)


def main() -> int:
    start = time.monotonic()
    try:
        tag = ensure_base_image()
    except NoEngine as exc:
        print(f"base image: {exc}", file=sys.stderr)
        return 1
    print(f"base image {tag} ready ({time.monotonic() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
