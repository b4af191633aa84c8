"""The clone of a project's tag: ``git clone --depth 1`` with credentials given only
through an askpass helper, only to the URL's host, never in a URL, an argv or a log."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from crawlhub.control.builders.artifact import BuildFailed
from crawlhub.control.builders.context import BuildContext, shown
from crawlhub.control.builders.process import ENV_BUILD, ENV_BUILD_OWNER, run_process

#: The askpass helper: git (and ssh) run it with a prompt; it answers from the
#: environment, and only for the host of the project's URL (a redirect elsewhere gets
#: nothing). The secret is never in the script, an argv or a URL.
_ASKPASS = """#!/bin/sh
case "$1" in
  *"//$CRAWLHUB_GIT_HOST'"*|*"@$CRAWLHUB_GIT_HOST'"*|*"@$CRAWLHUB_GIT_HOST's"*) ;;
  *) echo "crawlhub askpass: credentials are only given to $CRAWLHUB_GIT_HOST" >&2; exit 1 ;;
esac
case "$1" in
  Username*) printf '%s\\n' "$CRAWLHUB_GIT_USERNAME" ;;
  *) printf '%s\\n' "$CRAWLHUB_GIT_PASSWORD" ;;
esac
"""
#: Transports a clone may use (submodules included): never ext:: or fd::.
_ALLOWED_PROTOCOLS = "file:https:http:ssh"


def url_host(url: str) -> str:
    """``host[:port]`` of a git URL as git shows it in prompts ('' for local paths)."""
    if "://" in url:
        parts = urlsplit(url)
        netloc = parts.netloc.rpartition("@")[2]
        return netloc
    m = re.match(r"^(?:[^@/:]+@)?([^:/]+):", url)
    return m.group(1) if m else ""


async def clone(ctx: BuildContext, url: str, ref: str, *, username: str | None = None,
                password: str | None = None, base_env: Mapping[str, str] | None = None
                ) -> str:
    """``git clone --depth 1 --branch <ref> -- <url> <ctx.src>``; the commit checked out.

    Credentials reach git only through ``GIT_ASKPASS`` (and ``SSH_ASKPASS``): a helper
    script in a private temporary directory reading them from its environment. Prompts
    are off (``GIT_TERMINAL_PROMPT=0``), credential helpers are off (nothing is stored),
    only file, http(s) and ssh transports are allowed."""
    env = {k: v for k, v in (os.environ if base_env is None else base_env).items()
           if not k.upper().startswith("CRAWLHUB_")
           and k not in ("GIT_ASKPASS", "SSH_ASKPASS", "SSH_ASKPASS_REQUIRE")}
    env.update({"GIT_TERMINAL_PROMPT": "0", "GIT_ALLOW_PROTOCOL": _ALLOWED_PROTOCOLS,
                "GIT_TRACE_REDACT": "1", "GCM_INTERACTIVE": "never", "LC_ALL": "C"})
    env.update({k: ctx.env[k] for k in (ENV_BUILD, ENV_BUILD_OWNER) if k in ctx.env})
    helper_dir: str | None = None
    if username or password:
        helper_dir = tempfile.mkdtemp(prefix="crawlhub-askpass-")  # mode 0700
        script = Path(helper_dir) / "askpass.sh"
        fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
        with os.fdopen(fd, "w") as fh:
            fh.write(_ASKPASS)
        env.update({"GIT_ASKPASS": str(script), "SSH_ASKPASS": str(script),
                    "SSH_ASKPASS_REQUIRE": "force", "CRAWLHUB_GIT_HOST": url_host(url),
                    "CRAWLHUB_GIT_USERNAME": username or "",
                    "CRAWLHUB_GIT_PASSWORD": password or ""})
    try:
        ctx.root.mkdir(parents=True, exist_ok=True)
        argv = ["git", "-c", "credential.helper=", "-c", "advice.detachedHead=false",
                "-c", "protocol.ext.allow=never", "clone", "--depth", "1", "--branch", ref,
                "--", url, str(ctx.src)]
        ctx.say("$ " + " ".join(shown(a) for a in argv))
        code = await run_process(argv, cwd=ctx.root, env=env, timeout=ctx.remaining(),
                                 write=ctx.log.write)
        if code != 0:
            raise BuildFailed(f"git clone of {ref!r} failed (exit {code}); see the build log")
        lines: list[str] = []
        code = await run_process(["git", "-C", str(ctx.src), "rev-parse", "HEAD"],
                                 cwd=ctx.root, env=env, timeout=ctx.remaining(),
                                 write=lines.append)
        commit = lines[0].strip() if code == 0 and lines else ""
        ctx.commit = commit
        ctx.say(f"cloned {ref} at {commit or '(unknown commit)'}")
        return commit
    finally:
        if helper_dir is not None:
            shutil.rmtree(helper_dir, ignore_errors=True)
