"""Builds on real SQLite and PostgreSQL, cloning from a local bare git repository (and
over HTTP from ``git http-backend`` behind basic auth): the artifact and its version are
recorded with the log, credentials never leave the askpass helper, one build per version
at a time, and a build whose process died is marked failed at the next open."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crawlhub.control import builders
from crawlhub.control.builds import BuildService
from crawlhub.control.db import ControlDB
from crawlhub.control.projects import InvalidProject, NewProject, ProjectStore, ProjectUpdate
from crawlhub.control.secrets import SecretBox
from crawlhub.core.errors import ConflictError, NotFoundError
from crawlhub.core.process import pid_alive
from tests.control.gitremote import PACKAGED, Remote, git_http_server, make_remote
from tests.helpers import wait_for

PASSWORD = "s3cr3t-Pa55-word-xyz"
SLEEP = [sys.executable, "-c", "import os, time; print('working', os.getpid(), flush=True);"
         " time.sleep(30)"]


@pytest.fixture
def remote(tmp_path: Path) -> Remote:
    return make_remote(tmp_path / "git")


@pytest.fixture
async def store(control_db: ControlDB) -> ProjectStore:
    return await ProjectStore.open(control_db, SecretBox([SecretBox.new_key()]))


@pytest.fixture
async def service(control_db: ControlDB, store: ProjectStore, tmp_path: Path):  # type: ignore[no-untyped-def]
    svc = await BuildService.open(control_db, store, builds_dir=tmp_path / "builds",
                                  timeout=60, flush_every=0.1)
    yield svc
    await svc.close()


async def add(store: ProjectStore, url: str, name: str = "demo", **fields: object) -> None:
    await store.create(NewProject.model_validate({"name": name, "git_url": url, **fields}))


async def test_a_release_tag_is_cloned_and_built_into_a_venv_a_job_can_run(
        store: ProjectStore, service: BuildService, remote: Remote) -> None:
    await add(store, remote.url)
    started = await service.start("demo", tag="release/demo/1.0", trigger="hook")
    assert started.status in ("queued", "running") and started.version == "1.0"
    build = await service.wait(started.id, timeout=20)
    assert build.status == "succeeded", build.log
    assert build.commit == remote.commits["release/demo/1.0"]
    assert (build.tag, build.trigger, build.artifact_kind) == ("release/demo/1.0", "hook", "venv")
    assert "cloned release/demo/1.0" in (build.log or "")
    artifact = await service.artifact("demo", "1.0")
    assert artifact == await service.artifact("demo")  # latest
    assert (artifact.version, artifact.build, artifact.commit) == ("1.0", build.id, build.commit)
    assert artifact.path == build.artifact_path and artifact.workdir is not None
    assert Path(artifact.workdir, "job.py").is_file()
    # what a job runner does with it: the venv's python first on PATH, in the clone
    done = subprocess.run(["python", "job.py", "--n", "1"], cwd=artifact.workdir,
                          env=artifact.environ(), capture_output=True, text=True, timeout=20)
    assert done.stdout.strip() == "demo job ['--n', '1']"
    sdk = subprocess.run([str(artifact.python), "-c", "import crawlhub.sdk, sys;"
                          " print(sys.prefix)"], capture_output=True, text=True, timeout=20)
    assert sdk.stdout.strip() == artifact.path  # the venv, seeing crawlhub.sdk


@pytest.mark.parametrize("control_db", ["sqlite"], indirect=True)  # about the venv only
async def test_a_venv_imports_crawlhubs_scrapy_integration_and_needs_no_download_for_it(
        store: ProjectStore, service: BuildService, tmp_path: Path) -> None:
    # a Scrapy project as `scrapy startproject` leaves it, asking for Scrapy
    remote = make_remote(tmp_path / "git", {
        "requirements.txt": "scrapy\n",
        "scrapy.cfg": "[settings]\ndefault = shop.settings\n",
        "shop/__init__.py": "",
        "shop/settings.py": "BOT_NAME = 'shop'\nSPIDER_MODULES = ['shop.spiders']\n"
                            "EXTENSIONS = {'crawlhub.contrib.scrapy.extension.CrawlhubControl':"
                            " 500}\n",
        "shop/spiders/__init__.py": ""})
    await add(store, remote.url)
    build = await service.wait((await service.start("demo", tag="release/demo/1.0")).id, 60)
    assert build.status == "succeeded", build.log
    assert "Requirement already satisfied: scrapy" in (build.log or "")  # nothing fetched
    artifact = await service.artifact("demo")
    assert artifact.python is not None
    imported = subprocess.run(
        [artifact.python, "-c", "import sys, xxhash, crawlhub.contrib.scrapy.extension as e;"
         " print(sys.prefix, e.CrawlhubControl.__name__)"],
        capture_output=True, text=True, timeout=60)
    assert imported.stdout.split() == [artifact.path, "CrawlhubControl"], imported.stderr
    # `scrapy` on the job's PATH is the venv's, running in the clone with the extension
    shown = subprocess.run(["scrapy", "settings", "--get", "BOT_NAME"], cwd=artifact.workdir,
                           env=artifact.environ(), capture_output=True, text=True, timeout=60)
    assert shown.stdout.strip() == "shop", shown.stderr
    assert Path(artifact.bin_dir or "", "scrapy").read_text().startswith(
        f"#!{artifact.python}")


async def test_a_branch_builds_with_the_version_given(
        store: ProjectStore, service: BuildService, remote: Remote) -> None:
    await add(store, remote.url)
    head = remote.commit({"job.py": "print('dev')\n"})
    with pytest.raises(InvalidProject, match="needs a version"):
        await service.start("demo")
    build = await service.wait((await service.start("demo", version="dev")).id, timeout=20)
    assert build.status == "succeeded" and build.ref == "main" and build.tag is None
    assert build.commit == head
    assert (await service.artifact("demo", "dev")).commit == head


async def test_a_tag_outside_the_pattern_needs_a_version(
        store: ProjectStore, service: BuildService, remote: Remote) -> None:
    await add(store, remote.url)
    remote.tag("v2")
    with pytest.raises(InvalidProject, match="does not match"):
        await service.start("demo", tag="v2")
    build = await service.wait((await service.start("demo", tag="v2", version="2")).id, 20)
    assert build.status == "succeeded" and build.version == "2"


@pytest.mark.parametrize("kwargs, why", [
    ({"tag": "--upload-pack=touch"}, "not a branch or tag"),
    ({"tag": "release/demo/../x"}, "'..'"),
    ({"ref": "-b"}, "not a branch or tag"),
    ({"ref": "main", "version": "../1"}, "version"),
    ({"ref": "main", "version": "latest"}, "version"),
    ({"ref": "main", "version": "1/2"}, "version"),
])
async def test_hostile_refs_and_versions_are_refused(
        store: ProjectStore, service: BuildService, remote: Remote,
        kwargs: dict[str, str], why: str) -> None:
    await add(store, remote.url)
    with pytest.raises(InvalidProject, match=why):
        await service.start("demo", **kwargs)
    assert await service.list() == []


async def test_a_missing_tag_fails_the_build_and_leaves_no_artifact(
        store: ProjectStore, service: BuildService, remote: Remote, tmp_path: Path) -> None:
    await add(store, remote.url)
    build = await service.wait((await service.start("demo", tag="release/demo/9.9")).id, 20)
    assert build.status == "failed" and "git clone" in (build.error or "")
    assert "release/demo/9.9" in (build.log or "")
    assert not (tmp_path / "builds" / "demo" / f"9.9-{build.id}").exists()
    with pytest.raises(NotFoundError, match="no successful build"):
        await service.artifact("demo", "9.9")
    with pytest.raises(NotFoundError, match="no successful build of any version"):
        await service.artifact("demo")
    with pytest.raises(NotFoundError, match="no project"):
        await service.artifact("nope")
    with pytest.raises(NotFoundError, match="no project"):
        await service.start("nope", tag="release/nope/1")


async def test_one_build_per_project_and_version_at_a_time(
        store: ProjectStore, service: BuildService, remote: Remote) -> None:
    await add(store, remote.url, builder={"name": "command", "options": {"argv": SLEEP}})
    first = await service.start("demo", tag="release/demo/1.0")
    with pytest.raises(ConflictError, match="one build per project and version"):
        await service.start("demo", tag="release/demo/1.0")
    other = await service.start("demo", version="dev")  # another version may build
    assert other.id != first.id
    await service.close()  # stops both: each failed, interrupted
    for build_id in (first.id, other.id):
        build = await service.get(build_id)
        assert build.status == "failed" and "interrupted" in (build.error or "")


async def test_builds_are_listed_newest_first_by_project_and_status(
        store: ProjectStore, service: BuildService, remote: Remote) -> None:
    await add(store, remote.url)
    await add(store, remote.url, name="other", release_name="demo")
    ids = []
    for project, version in (("demo", "a"), ("other", "b"), ("demo", "c")):
        ids.append((await service.start(project, version=version)).id)
    for build_id in ids:
        await service.wait(build_id, 20)
    assert [b.id for b in await service.list()] == ids[::-1]
    assert [b.version for b in await service.list(project="demo")] == ["c", "a"]
    assert [b.id for b in await service.list(limit=1, before=ids[2])] == [ids[1]]
    assert len(await service.list(status="succeeded")) == 3
    assert await service.list(status="failed") == []
    assert all(b.log is None for b in await service.list())


async def test_a_build_over_its_time_limit_fails_and_its_process_is_killed(
        store: ProjectStore, control_db: ControlDB, remote: Remote, tmp_path: Path) -> None:
    marker = tmp_path / "still-running"
    argv = [sys.executable, "-c", "import time, pathlib; time.sleep(2);"
            f" pathlib.Path({str(marker)!r}).touch()"]
    await add(store, remote.url, builder={"name": "command", "options": {"argv": argv}})
    service = await BuildService.open(control_db, store, builds_dir=tmp_path / "b", timeout=1)
    try:
        build = await service.wait((await service.start("demo", version="1")).id, 10)
        assert build.status == "failed" and "time limit" in (build.error or "")
        await asyncio.sleep(1.5)
        assert not marker.exists()  # killed, with its process group
    finally:
        await service.close()


async def test_a_step_is_over_when_its_process_exits_and_what_it_left_running_is_killed(
        store: ProjectStore, control_db: ControlDB, remote: Remote, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(builders.process, "READ_TAIL", 0.3)
    # the step starts a process that inherits its output and outlives it by far
    child = "import time; print('child writing', flush=True); time.sleep(60)"
    argv = [sys.executable, "-c", "import subprocess, sys;"
            f" p = subprocess.Popen([sys.executable, '-c', {child!r}]);"
            " print('started', p.pid, flush=True)"]
    await add(store, remote.url, builder={"name": "command", "options": {"argv": argv}})
    service = await BuildService.open(control_db, store, builds_dir=tmp_path / "b", timeout=30)
    try:
        build = await service.wait((await service.start("demo", version="1")).id, 20)
        assert build.status == "succeeded", build.error
        full = await service.get(build.id)
        assert "child writing" in (full.log or "")  # its output until the step ended is kept
        [pid] = [int(line.split()[-1]) for line in (full.log or "").splitlines()
                 if line.startswith("started ")]
        await wait_for(lambda: not pid_alive(pid), "the step's leftover process to be killed")
    finally:
        await service.close()


async def test_the_log_keeps_the_last_lines(
        store: ProjectStore, control_db: ControlDB, remote: Remote, tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "for i in range(5000): print('line', i)"]
    await add(store, remote.url, builder={"name": "command", "options": {"argv": argv}})
    service = await BuildService.open(control_db, store, builds_dir=tmp_path / "b",
                                      log_lines=200)
    try:
        build = await service.wait((await service.start("demo", version="1")).id, 20)
    finally:
        await service.close()
    lines = (build.log or "").splitlines()
    assert len(lines) == 201 and lines[0].endswith("earlier lines dropped]")
    assert "line 4999" in lines[-2]
    assert await service.log_text(build.id) == build.log


async def test_the_command_builder_records_the_directory_it_leaves(
        store: ProjectStore, service: BuildService, remote: Remote) -> None:
    argv = [sys.executable, "-c", "import os, pathlib; d = pathlib.Path('out'); d.mkdir();"
            " (d / 'app.txt').write_text(os.environ['CRAWLHUB_VERSION'])"]
    await add(store, remote.url, builder={"name": "command",
                                          "options": {"argv": argv, "artifact": "out"}})
    build = await service.wait((await service.start("demo", tag="release/demo/1.0")).id, 20)
    assert build.status == "succeeded", build.log
    artifact = await service.artifact("demo", "1.0")
    assert artifact.kind == "dir" and Path(artifact.path, "app.txt").read_text() == "1.0"
    missing = [sys.executable, "-c", "pass"]
    await add(store, remote.url, name="none", release_name="demo",
              builder={"name": "command", "options": {"argv": missing, "artifact": "out"}})
    failed = await service.wait((await service.start("none", version="1")).id, 20)
    assert failed.status == "failed" and "left no 'out'" in (failed.error or "")


async def test_the_wheel_builder_makes_an_importable_wheel(
        store: ProjectStore, service: BuildService, tmp_path: Path) -> None:
    remote = make_remote(tmp_path / "pkg", PACKAGED)
    await add(store, remote.url, builder="wheel")
    build = await service.wait((await service.start("demo", tag="release/demo/1.0")).id, 60)
    assert build.status == "succeeded", build.log
    artifact = await service.artifact("demo", "1.0")
    assert artifact.kind == "wheel" and artifact.path.endswith(".whl")
    done = subprocess.run([sys.executable, "-c", "import demo; print(demo.VALUE, demo.__file__)"],
                          capture_output=True, text=True, timeout=20, cwd=tmp_path,
                          env=artifact.environ())
    assert done.stdout.split()[0] == "42" and ".whl" in done.stdout


async def test_the_venv_builder_installs_a_packaged_project(
        store: ProjectStore, service: BuildService, tmp_path: Path) -> None:
    remote = make_remote(tmp_path / "pkg", PACKAGED)
    await add(store, remote.url)
    build = await service.wait((await service.start("demo", tag="release/demo/1.0")).id, 60)
    assert build.status == "succeeded", build.log
    assert "install ." in (build.log or "")
    artifact = await service.artifact("demo")
    done = subprocess.run([str(artifact.python), "-c", "import demo; print(demo.VALUE)"],
                          capture_output=True, text=True, timeout=20, cwd=tmp_path)
    assert done.stdout.strip() == "42"


async def test_the_docker_builder_fails_clearly_without_a_docker_engine(
        store: ProjectStore, service: BuildService, remote: Remote, tmp_path: Path) -> None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "info"], capture_output=True,
                                 timeout=20).returncode == 0:
        pytest.skip("a Docker engine answers here")
    remote.commit({"Dockerfile": "FROM scratch\n"})
    remote.tag("release/demo/2.0")
    await add(store, remote.url, builder="docker")
    build = await service.wait((await service.start("demo", tag="release/demo/2.0")).id, 30)
    assert build.status == "failed"
    assert "no Docker engine answers" in (build.error or "")


async def test_credentials_go_to_git_through_askpass_and_never_into_argv_or_logs(
        store: ProjectStore, service: BuildService, remote: Remote, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    # git writes every command it runs (argv, the askpass helper's included) to a file of
    # its own: a view of the argv that the build log's masking cannot hide
    trace = tmp_path / "git-trace.txt"
    monkeypatch.setenv("GIT_TRACE", str(trace))
    with git_http_server(remote.bare.parent, "ci", PASSWORD) as server:
        url = f"{server.url}{remote.bare.name}"
        await add(store, url, username="ci", password=PASSWORD)
        await add(store, url, name="wrong", release_name="demo", username="ci",
                  password="not-the-" + PASSWORD)
        good = await service.wait((await service.start("demo", tag="release/demo/1.0")).id, 30)
        bad = await service.wait((await service.start("wrong", tag="release/demo/1.0")).id, 30)
    assert good.status == "succeeded", good.log
    assert ("GET", f"/{remote.bare.name}/info/refs", "ci") in server.requests
    assert bad.status == "failed" and "git clone" in (bad.error or "")
    traced = trace.read_text()
    assert "built-in: git clone" in traced
    assert "askpass.sh 'Password for" in traced and url in traced
    for text in (traced, good.log, bad.log, good.model_dump_json(), bad.model_dump_json(),
                 caplog.text):
        assert PASSWORD not in (text or "")
    assert await service.artifact("demo", "1.0")


def test_the_askpass_helper_answers_only_for_the_remotes_host(tmp_path: Path) -> None:
    script = tmp_path / "askpass.sh"
    script.write_text(builders.git._ASKPASS)
    script.chmod(0o700)
    env = {"PATH": os.environ["PATH"], "CRAWLHUB_GIT_HOST": "127.0.0.1:8080",
           "CRAWLHUB_GIT_USERNAME": "ci", "CRAWLHUB_GIT_PASSWORD": PASSWORD}

    def ask(prompt: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(script), prompt], env=env, capture_output=True, text=True)

    assert ask("Username for 'http://127.0.0.1:8080': ").stdout == "ci\n"
    assert ask("Password for 'http://ci@127.0.0.1:8080': ").stdout == PASSWORD + "\n"
    assert ask("ci@127.0.0.1:8080's password: ").stdout == PASSWORD + "\n"
    elsewhere = ask("Password for 'https://ci@evil.example.com': ")
    assert elsewhere.returncode != 0 and elsewhere.stdout == ""
    assert ask("Password for 'https://ci@127.0.0.1:80800': ").stdout == ""


def test_secrets_are_masked_in_every_form_a_tool_may_print() -> None:
    import base64
    from urllib.parse import quote

    redact = builders.Redactor(["p@ss/wörd"], username="ci")
    basic = base64.b64encode(b"ci:p@ss/w\xc3\xb6rd").decode()
    line = (f"a p@ss/wörd b {quote('p@ss/wörd', safe='')} c Basic {basic}"
            " d https://bob:other@host/x")
    masked = redact(line)
    assert "p@ss" not in masked and basic not in masked and "other" not in masked
    assert masked.count("***") == 4


async def test_a_build_whose_process_was_killed_is_marked_failed_at_the_next_open(
        control_db: ControlDB, remote: Remote, tmp_path: Path) -> None:
    key = SecretBox.new_key()
    store = await ProjectStore.open(control_db, SecretBox([key]))
    await add(store, remote.url, password=PASSWORD,
              builder={"name": "command", "options": {"argv": SLEEP}})
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, control_db.url, control_db.prefix, key,
         str(tmp_path / "builds")], stdout=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        assert child.stdout is not None
        build_id = int(child.stdout.readline())
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
    half_made = tmp_path / "builds" / "demo" / f"1-{build_id}"
    assert half_made.is_dir()
    [step] = [int(line.split()[1]) for line in
              (await BuildService(control_db, store, builds_dir=tmp_path).log_text(build_id))
              .splitlines() if line.startswith("working ")]
    assert pid_alive(step)  # the build's step runs on after its server was killed
    builds = await BuildService.open(control_db, store, builds_dir=tmp_path / "builds")
    try:
        build = await builds.get(build_id)
        assert build.status == "failed" and "interrupted" in (build.error or "")
        assert "working" in (build.log or "")  # the log written while it ran is kept
        assert not pid_alive(step)  # the step it left was killed
        assert not half_made.exists()  # and its directory removed
        # the version can be built again at once
        again = await builds.start("demo", version="1")
        assert again.id != build_id
    finally:
        await builds.close()
    with pytest.raises(ProcessLookupError):
        os.killpg(child.pid, 0)


async def test_a_build_left_by_an_earlier_process_with_this_pid_is_interrupted_at_open(
        store: ProjectStore, control_db: ControlDB, remote: Remote, tmp_path: Path) -> None:
    # a container's server is pid 1 at every start: the row of the build the killed one
    # was running names this very process, touched a moment ago
    await add(store, remote.url)
    builds = await BuildService.open(control_db, store, builds_dir=tmp_path / "builds")
    try:
        first = await builds.wait((await builds.start("demo", version="1")).id, 20)
        half_made = tmp_path / "builds" / "demo" / f"1-{first.id}"
        assert half_made.is_dir()
        await control_db.execute(
            f"UPDATE {builds.table} SET status = 'running', finished = NULL, beat = $1,"
            " owner = $2 WHERE id = $3", time.time(), builders.host_owner(), first.id)
    finally:
        await builds.close()
    again = await BuildService.open(control_db, store, builds_dir=tmp_path / "builds")
    try:
        build = await again.get(first.id)
        assert build.status == "failed" and "interrupted" in (build.error or "")
        assert not half_made.exists()
        assert (await again.wait((await again.start("demo", version="1")).id, 20)).status \
            == "succeeded"  # and the version builds again at once
    finally:
        await again.close()


_CHILD = """
import asyncio, sys
from crawlhub.control.builds import BuildService
from crawlhub.control.db import ControlDB
from crawlhub.control.projects import ProjectStore
from crawlhub.control.secrets import SecretBox

async def main():
    url, prefix, key, builds_dir = sys.argv[1:]
    db = await ControlDB.open(url, prefix=prefix)
    store = await ProjectStore.open(db, SecretBox([key]))
    service = await BuildService.open(db, store, builds_dir=builds_dir, flush_every=0.05)
    build = await service.start("demo", version="1")
    while "\\nworking " not in await service.log_text(build.id):  # the step's own line
        await asyncio.sleep(0.05)
    print(build.id, flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


async def test_removing_a_project_removes_its_builds_unless_one_runs(
        store: ProjectStore, service: BuildService, remote: Remote, tmp_path: Path) -> None:
    await add(store, remote.url)
    await service.wait((await service.start("demo", tag="release/demo/1.0")).id, 20)
    assert (tmp_path / "builds" / "demo").is_dir()
    await store.update("demo", ProjectUpdate.model_validate(
        {"builder": {"name": "command", "options": {"argv": SLEEP}}}))
    running = await service.start("demo", version="2")
    with pytest.raises(ConflictError, match="is queued|is running"):
        await service.delete_project("demo")
    await service.close()
    assert (await service.get(running.id)).status == "failed"
    await service.delete_project("demo")
    assert await service.list() == []
    assert not (tmp_path / "builds" / "demo").exists()
    with pytest.raises(NotFoundError):
        await store.get("demo")
    with pytest.raises(NotFoundError):
        await service.delete_project("demo")


async def test_a_relative_builds_dir_is_taken_from_where_the_service_started(
        store: ProjectStore, control_db: ControlDB, remote: Remote, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    service = await BuildService.open(control_db, store, builds_dir="data/builds")
    try:
        await add(store, remote.url)
        build = await service.wait((await service.start("demo", tag="release/demo/1.0")).id,
                                   20)
        assert build.status == "succeeded", build.log
        monkeypatch.chdir("/")
        artifact = await service.artifact("demo")
        assert artifact.path.startswith(str(tmp_path / "data" / "builds" / "demo"))
        assert Path(artifact.workdir or "", "job.py").is_file()
    finally:
        await service.close()
