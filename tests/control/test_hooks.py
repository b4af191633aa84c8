"""Forge webhooks: signatures made the way GitHub, Gitea and GitLab make them, hostile
requests refused, push payloads read, tag patterns checked against git's own rules."""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crawlhub.control.hooks import (
    DEFAULT_TAG_PATTERN,
    HookError,
    HookRejected,
    TagPattern,
    parse,
    ref_format_problems,
    verify,
)

SECRET = "whsec-7f3a"


def github(body: bytes, secret: str = SECRET, event: str = "push") -> dict[str, str]:
    sig = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"X-GitHub-Event": event, "X-Hub-Signature-256": f"sha256={sig}",
            "Content-Type": "application/json"}


def gitea(body: bytes, secret: str = SECRET, event: str = "push") -> dict[str, str]:
    sig = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"X-Gitea-Event": event, "X-Gitea-Signature": sig, "X-GitHub-Event": event}


def gitlab(secret: str = SECRET, event: str = "Tag Push Hook") -> dict[str, str]:
    return {"X-Gitlab-Event": event, "X-Gitlab-Token": secret}


TAG_PUSH = json.dumps({
    "ref": "refs/tags/release/shop/1.4.0", "after": "a" * 40, "deleted": False,
    "repository": {"clone_url": "http://127.0.0.1:3000/team/shop.git"}}).encode()
GITLAB_TAG = json.dumps({
    "object_kind": "tag_push", "ref": "refs/tags/release/shop/1.4.0", "checkout_sha": "b" * 40,
    "after": "b" * 40, "project": {"git_http_url": "http://127.0.0.1/team/shop.git"}}).encode()


@pytest.mark.parametrize("make", [github, gitea])
def test_signed_pushes_are_verified_and_read(make) -> None:  # type: ignore[no-untyped-def]
    headers = make(TAG_PUSH)
    forge = verify(headers, TAG_PUSH, SECRET)
    push = parse(forge, headers, TAG_PUSH)
    assert push is not None and push.tag == "release/shop/1.4.0" and push.commit == "a" * 40
    assert push.repository == "http://127.0.0.1:3000/team/shop.git" and not push.deleted
    assert forge == make.__name__


def test_a_gitlab_tag_push_is_verified_by_its_token_and_read() -> None:
    headers = gitlab()
    forge = verify(headers, GITLAB_TAG, SECRET)
    push = parse(forge, headers, GITLAB_TAG)
    assert forge == "gitlab" and push is not None
    assert (push.tag, push.commit, push.repository) == (
        "release/shop/1.4.0", "b" * 40, "http://127.0.0.1/team/shop.git")


@pytest.mark.parametrize("headers, why", [
    ({}, "no forge event header"),
    ({"X-GitHub-Event": "push"}, "without X-Hub-Signature-256"),
    ({"X-GitHub-Event": "push", "X-Hub-Signature-256": "sha1=abc"}, "not 'sha256=<hex>'"),
    ({"X-GitHub-Event": "push", "X-Hub-Signature-256": "sha256=" + "0" * 64}, "bad signature"),
    ({"X-Gitea-Event": "push"}, "without X-Gitea-Signature"),
    ({"X-Gitea-Event": "push", "X-Gitea-Signature": "é"}, "bad signature"),
    ({"X-Gitlab-Event": "Push Hook"}, "without X-Gitlab-Token"),
    ({"X-Gitlab-Event": "Push Hook", "X-Gitlab-Token": SECRET + "x"}, "wrong X-Gitlab-Token"),
])
def test_unsigned_or_badly_signed_hooks_are_refused(headers: dict[str, str], why: str) -> None:
    with pytest.raises(HookRejected, match=why):
        verify(headers, TAG_PUSH, SECRET)


def test_a_signature_over_another_body_or_with_another_secret_is_refused() -> None:
    with pytest.raises(HookRejected):
        verify(github(TAG_PUSH), TAG_PUSH + b" ", SECRET)
    with pytest.raises(HookRejected):
        verify(github(TAG_PUSH, secret="other"), TAG_PUSH, SECRET)
    with pytest.raises(HookRejected, match="no webhook secret"):
        verify(github(TAG_PUSH, secret=""), TAG_PUSH, "")


def test_header_names_are_matched_without_case() -> None:
    headers = {k.lower(): v for k, v in github(TAG_PUSH).items()}
    assert verify(headers, TAG_PUSH, SECRET) == "github"


def test_events_that_are_not_pushes_are_ignored_and_bad_payloads_named() -> None:
    ping = b'{"zen": "hi"}'
    assert parse("github", github(ping, event="ping"), ping) is None
    assert parse("gitlab", gitlab(event="Issue Hook"), ping) is None
    with pytest.raises(HookError, match="not JSON"):
        parse("github", github(b"{"), b"{")
    with pytest.raises(HookError, match="refs/"):
        parse("github", github(b"{}"), b"{}")
    deleted = json.dumps({"ref": "refs/tags/release/a/1", "after": "0" * 40,
                          "deleted": True, "repository": {}}).encode()
    push = parse("github", github(deleted), deleted)
    assert push is not None and push.deleted and push.commit == "" and push.repository == ""


def test_the_default_pattern_matches_release_tags_and_makes_them() -> None:
    pattern = TagPattern()
    assert pattern.pattern == DEFAULT_TAG_PATTERN
    assert pattern.match("release/shop/1.4.0") == {"name": "shop", "version": "1.4.0"}
    assert pattern.match("release/shop/1.4.0/x") is None
    assert pattern.match("v1.4.0") is None
    assert pattern.tag(name="shop", version="2.0") == "release/shop/2.0"
    assert TagPattern("v{version}").match("v3.1") == {"version": "3.1"}
    assert TagPattern("{release}-{name}-{version}").match("r1-shop-2") == {
        "release": "r1", "name": "shop", "version": "2"}


def test_seed_001s_colon_pattern_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="git forbids ':'"):
        TagPattern("{release}:{name}:{version}")
    for bad, why in (("release/{name}", "needs a {version}"), ("{nme}/{version}", "unknown"),
                     ("{version}/{version}", "twice"), ("rel..{version}", "'..'"),
                     ("{version}.lock", ".lock"), ("rel {version}", "contains ' '")):
        with pytest.raises(ValueError, match=why):
            TagPattern(bad)


def _git_accepts(ref: str) -> bool:
    done = subprocess.run(["git", "check-ref-format", f"refs/{ref}"], capture_output=True)
    return done.returncode == 0


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab/.-_@{}:~^?*[\\ \x01lock")), min_size=1,
               max_size=14))
def test_ref_rules_agree_with_git_check_ref_format(name: str) -> None:
    """Differential: our reading of git's ref rules against git itself."""
    assert (not ref_format_problems(f"tags/{name}")) == _git_accepts(f"tags/{name}"), name
