"""The ``image`` builder on the real engine, and seed 001's rows end to end: a release
tag (as the webhook starts it) builds ``crawlhub/<project>:<version>`` from the project's
Containerfile, or from the default recipe (base image + the project's requirements +
crawlhub's SDK); the build keeps the image's id and size; a job picks the project and
version and runs in that image; old images are pruned to ``keep``."""

from __future__ import annotations

import json
import subprocess
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crawlhub.control.builds import BuildService
from crawlhub.control.db import ControlDB
from crawlhub.control.jobs import JobService, JobSpec
from crawlhub.control.projects import NewProject, ProjectStore
from crawlhub.control.secrets import SecretBox
from tests.containers.baseimage import ENGINE
from tests.control.gitremote import make_remote


@pytest.fixture
async def builds(tmp_path: Path, base_image: str) -> AsyncIterator[BuildService]:
    db = await ControlDB.open(f"sqlite:///{tmp_path}/builds.db")
    store = await ProjectStore.open(db, SecretBox([SecretBox.new_key()]))
    service = await BuildService.open(db, store, builds_dir=tmp_path / "builds", timeout=300,
                                      flush_every=0.1)
    yield service
    await service.close()
    await db.close()


def images_of(repo: str) -> list[str]:
    out = subprocess.run([ENGINE, "images", "--format", "json"], capture_output=True,
                         text=True, check=True)
    return sorted(name for row in json.loads(out.stdout or "[]") or []
                  for name in row.get("Names") or [] if name.rpartition(":")[0].endswith(repo))


def remove_images(repo: str) -> None:
    for name in images_of(repo):
        subprocess.run([ENGINE, "rmi", "-f", name], capture_output=True, check=False)


async def test_a_release_tag_with_a_containerfile_becomes_an_image_a_job_runs_in(
        builds: BuildService, container_jobs: JobService, tmp_path: Path,
        base_image: str, unique_name: str) -> None:
    project = f"cf-{unique_name}"[:60].lower()
    remote = make_remote(tmp_path / "git", {
        "Containerfile": f"FROM {base_image}\nCOPY job.py /srv/job.py\nWORKDIR /srv\n",
        "job.py": "import sys\nfrom crawlhub import sdk\nprint('image job', sys.argv[1:])\n"
                  "sdk.set_counter('success', 7)\nsdk.flush()\n"},
        tags=(f"release/{project}/1.0",))
    await builds.projects.create(NewProject.model_validate(
        {"name": project, "git_url": remote.url, "builder": "image"}))
    try:
        build = await builds.wait((await builds.start(
            project, tag=f"release/{project}/1.0", trigger="hook")).id, timeout=300)
        assert build.status == "succeeded", build.log
        assert build.artifact_kind == "image"
        assert build.artifact_path == f"crawlhub/{project}:1.0"
        assert build.artifact_meta["size"] > 0 and build.artifact_meta["id"]
        assert "from the project's Containerfile" in (build.log or "")
        container_jobs.runner.artifacts = builds.artifact
        await container_jobs.create(JobSpec(name="imaged", runtime="container",
                                            project=project, version="1.0",
                                            command=["python3", "job.py", "--n", "1"]))
        run = await container_jobs.run("imaged")
        done = await container_jobs.runner.wait(run.id)
        assert (done.status, done.version) == ("succeeded", "1.0"), done
        assert "image job ['--n', '1']" in container_jobs.sink.text(run.id)  # type: ignore[attr-defined]
        assert done.counters == {"success": 7}
    finally:
        remove_images(f"crawlhub/{project}")


def a_wheel(where: Path) -> Path:
    """A wheel of a package ``demo`` (``VALUE = 42``), as a local index holds it."""
    where.mkdir(parents=True)
    path = where / "demo-1.0-py3-none-any.whl"
    info = "demo-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("demo/__init__.py", "VALUE = 42\n")
        wheel.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                       "Root-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    return where


async def test_the_default_recipe_installs_the_requirements_and_the_sdk_and_keeps_n_images(
        builds: BuildService, tmp_path: Path, unique_name: str, base_image: str) -> None:
    project = f"rc-{unique_name}"[:60].lower()
    remote = make_remote(tmp_path / "git", {
        "requirements.txt": "demo==1.0\n", "job.py": "import demo\nprint('value', demo.VALUE)\n"},
        tags=(f"release/{project}/1.0",))
    index = a_wheel(tmp_path / "wheels")
    await builds.projects.create(NewProject.model_validate(
        {"name": project, "git_url": remote.url,
         "builder": {"name": "image", "options": {
             "keep": 1, "pip_args": ["--no-index", "--find-links", str(index)]}},
         }))
    repo = f"crawlhub/{project}"
    # an older build's image, which keep: 1 prunes
    subprocess.run([ENGINE, "tag", base_image, f"{repo}:0.9"], check=True)
    try:
        first = await builds.wait((await builds.start(
            project, tag=f"release/{project}/1.0")).id, timeout=300)
        assert first.status == "succeeded", first.log
        assert "the default recipe" in (first.log or "")
        assert [name.rpartition("/")[2] for name in images_of(repo)] == [f"{project}:1.0"]
        assert f"pruning localhost/{repo}:0.9 (keep 1)" in (first.log or "")
        # the image stands alone: its requirements and crawlhub's SDK, nothing mounted
        ran = subprocess.run([ENGINE, "run", "--rm", "--network", "none", f"{repo}:1.0",
                              "python3", "-c", "import demo, crawlhub.sdk, os;"
                              " print(demo.VALUE, os.getcwd(), sorted(os.listdir()))"],
                             capture_output=True, text=True, timeout=120)
        assert ran.stdout.split(" ", 2)[:2] == ["42", "/app"], ran.stderr
        assert "job.py" in ran.stdout
    finally:
        remove_images(repo)
