"""Projects on real SQLite and PostgreSQL: secrets stored encrypted and never in a record,
names and git URLs checked (hostile ones refused), tag patterns checked against git's own
ref rules, paging, changes, removal."""

from __future__ import annotations

import json
import subprocess

import pytest
from pydantic import ValidationError

from crawlhub.control.db import ControlDB
from crawlhub.control.hooks import DEFAULT_TAG_PATTERN
from crawlhub.control.projects import (
    InvalidProject,
    NewProject,
    ProjectStore,
    ProjectUpdate,
    check_git_url,
)
from crawlhub.control.secrets import SecretBox, SecretError
from crawlhub.core.errors import ConflictError, NotFoundError

PASSWORD = "pw-Zq81-never-shown"
HOOK_SECRET = "hook-secret-5521"


@pytest.fixture
async def store(control_db: ControlDB) -> ProjectStore:
    return await ProjectStore.open(control_db, SecretBox([SecretBox.new_key()]))


def new(name: str = "shop", **fields: object) -> NewProject:
    data = {"name": name, "git_url": "https://git.example.com/team/shop.git", **fields}
    return NewProject.model_validate(data)


async def test_a_project_is_stored_with_its_secrets_encrypted_and_never_shown(
        store: ProjectStore, control_db: ControlDB) -> None:
    project = await store.create(new(username="ci", password=PASSWORD,
                                     webhook_secret=HOOK_SECRET))
    assert project.has_password and project.has_webhook_secret
    assert project.username == "ci" and project.default_branch == "main"
    assert project.tag_pattern == DEFAULT_TAG_PATTERN and project.release_name == "shop"
    assert project.builder.name == "venv" and project.hook_path == "/hooks/shop"
    shown = project.model_dump_json() + repr(project) + str(await store.list())
    assert PASSWORD not in shown and HOOK_SECRET not in shown
    row = await control_db.fetchone(
        f"SELECT password, webhook_secret FROM {control_db.table('projects')}")
    assert row is not None
    assert PASSWORD not in row[0] and HOOK_SECRET not in row[1]  # Fernet tokens
    assert row[0].startswith("gAAAAA")
    creds = await store.credentials("shop")
    assert creds.username == "ci" and creds.password is not None
    assert creds.password.reveal() == PASSWORD and str(creds.password) == "***"
    secret = await store.webhook_secret("shop")
    assert secret is not None and secret.reveal() == HOOK_SECRET


async def test_a_second_project_of_the_same_name_is_a_conflict(store: ProjectStore) -> None:
    await store.create(new())
    with pytest.raises(ConflictError, match="exists already"):
        await store.create(new(git_url="/srv/git/other.git"))


async def test_projects_are_listed_by_name_a_page_at_a_time(store: ProjectStore) -> None:
    for name in ("b-2", "a.1", "C_3", "a-1"):
        await store.create(new(name))
    first = await store.list(limit=3)
    rest = await store.list(limit=3, after=first[-1].name)
    assert [p.name for p in first + rest] == sorted(["b-2", "a.1", "C_3", "a-1"])
    assert await store.count() == 4


async def test_a_change_replaces_or_removes_secrets_and_keeps_the_rest(
        store: ProjectStore) -> None:
    await store.create(new(password=PASSWORD, webhook_secret=HOOK_SECRET))
    changed = await store.update("shop", ProjectUpdate.model_validate(
        {"password": "new-password-1", "default_branch": "develop",
         "builder": {"name": "command", "options": {"argv": ["make", "dist"]}}}))
    assert changed.default_branch == "develop" and changed.builder.name == "command"
    assert changed.builder.options["argv"] == ["make", "dist"]
    creds = await store.credentials("shop")
    assert creds.password is not None and creds.password.reveal() == "new-password-1"
    gone = await store.update("shop", ProjectUpdate.model_validate(
        {"password": None, "webhook_secret": None, "tag_pattern": "v{version}"}))
    assert not gone.has_password and not gone.has_webhook_secret
    assert gone.tag_pattern == "v{version}" and gone.git_url.endswith("shop.git")
    assert await store.webhook_secret("shop") is None
    back = await store.update("shop", ProjectUpdate.model_validate({"tag_pattern": None}))
    assert back.tag_pattern == DEFAULT_TAG_PATTERN


async def test_unknown_projects_are_not_found(store: ProjectStore) -> None:
    for name in ("nope", "../etc", ""):
        with pytest.raises(NotFoundError):
            await store.get(name)
    with pytest.raises(NotFoundError):
        await store.update("nope", ProjectUpdate())
    with pytest.raises(NotFoundError):
        await store.delete("nope")
    assert await store.webhook_secret("../etc") is None


async def test_a_removed_project_is_gone(store: ProjectStore) -> None:
    await store.create(new())
    await store.delete("shop")
    with pytest.raises(NotFoundError):
        await store.get("shop")


async def test_a_stored_secret_needs_the_key_it_was_stored_under(
        store: ProjectStore, control_db: ControlDB) -> None:
    await store.create(new(password=PASSWORD))
    other = ProjectStore(control_db, SecretBox([SecretBox.new_key()]))
    with pytest.raises(SecretError, match="cannot be decrypted") as caught:
        await other.credentials("shop")
    assert PASSWORD not in str(caught.value)


@pytest.mark.parametrize("name", ["../x", "..", ".hidden", "-rf", "a/b", "a b", "", "x" * 65,
                                  "naïve", "a\nb"])
def test_project_names_outside_the_rule_are_refused(name: str) -> None:
    with pytest.raises(ValidationError, match="name"):
        new(name)


@pytest.mark.parametrize("url, why", [
    ("ext::sh -c touch% /tmp/pwned", "spaces"),
    ("ext::sh", "transport helper"),
    ("fd::3", "transport helper"),
    ("--upload-pack=touch /tmp/pwned", "spaces"),
    ("--upload-pack=touch", "starts with '-'"),
    ("-oProxyCommand=x", "starts with '-'"),
    ("ssh://-oProxyCommand=touch/x", "no valid host"),
    ("git://git.example.com/x.git", "git:// is not taken"),
    ("ftp://git.example.com/x.git", "ftp:// is not taken"),
    ("http://git.example.com/x.git", "loopback"),
    ("relative/path.git", "not a git URL"),
    ("file://remote-host/srv/x.git", "local absolute path"),
    ("https://bob:" + PASSWORD + "@git.example.com/x.git", "holds a password"),
])
def test_hostile_or_unsafe_git_urls_are_refused(url: str, why: str) -> None:
    with pytest.raises(InvalidProject, match=why) as caught:
        check_git_url(url)
    assert PASSWORD not in str(caught.value)
    with pytest.raises(ValidationError) as invalid:
        new(git_url=url)
    assert PASSWORD not in str(invalid.value.errors(include_input=False))


@pytest.mark.parametrize("url", [
    "https://git.example.com/team/shop.git", "ssh://git@git.example.com:2222/team/shop.git",
    "git@github.com:team/shop.git", "file:///srv/git/shop.git", "/srv/git/shop.git",
    "http://127.0.0.1:3000/team/shop.git", "http://localhost/x.git", "http://[::1]:80/x",
    "https://ci@git.example.com/team/shop.git",
])
def test_git_urls_of_forges_and_local_remotes_are_taken(url: str) -> None:
    assert check_git_url(url) == url


def test_seed_001s_colon_pattern_is_refused_with_gits_reason() -> None:
    # git itself refuses such a tag: the reason given is git's rule, not a guess
    refused = subprocess.run(["git", "check-ref-format", "refs/tags/Release:shop:1.0"],
                             capture_output=True)
    assert refused.returncode != 0
    for pattern in ("{Release}:{Name}:{Version}", "{release}:{name}:{version}"):
        with pytest.raises(ValidationError, match="git forbids ':'"):
            new(tag_pattern=pattern)
    with pytest.raises(ValidationError, match="needs a \\{version\\}"):
        new(tag_pattern="release/{name}")


def test_a_release_tag_gives_its_version_only_for_the_projects_release_name() -> None:
    from crawlhub.control.projects import BuilderSpec, Project

    project = Project(name="shop", git_url="/srv/x", username=None, has_password=False,
                      has_webhook_secret=True, default_branch="main",
                      tag_pattern=DEFAULT_TAG_PATTERN, release_name="shop",
                      builder=BuilderSpec(), hook_path="/hooks/shop", created=0, updated=0)
    assert project.release("release/shop/1.4.0") == ("1.4.0", "")
    version, why = project.release("release/cart/1.4.0")
    assert version is None and "release of 'cart'" in why
    version, why = project.release("v1.4.0")
    assert version is None and "does not match" in why


@pytest.mark.parametrize("builder, why", [
    ({"name": "make"}, "unknown builder"),
    ({"name": "command", "options": {}}, "argv"),
    ({"name": "command", "options": {"argv": ["make"], "artifact": "../../etc"}}, "inside"),
    ({"name": "docker", "options": {"dockerfile": "/etc/passwd"}}, "inside"),
    ({"name": "docker", "options": {"image": "Bad Image"}}, "repository name"),
    ({"name": "venv", "options": {"shell": "rm -rf /"}}, "shell"),
])
def test_builder_options_are_checked_when_a_project_is_saved(
        builder: dict[str, object], why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        new(builder=builder)


def test_a_builder_named_alone_takes_its_defaults() -> None:
    spec = new(builder="wheel")
    assert spec.builder is not None and spec.builder.name == "wheel"
    assert json.loads(spec.builder.model_dump_json())["options"] == {"pip_args": []}


def test_a_short_webhook_secret_is_refused_without_showing_it() -> None:
    with pytest.raises(ValidationError) as caught:
        new(webhook_secret="abc12")
    assert "at least 8" in str(caught.value)
    assert "abc12" not in json.dumps(caught.value.errors(include_input=False), default=str)
