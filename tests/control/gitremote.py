"""A project's git remote for tests: a local bare repository with tagged commits, and the
same repository served over HTTP by ``git http-backend`` behind basic auth (a real git
smart-HTTP server on 127.0.0.1, so credentials go the way they go to a forge)."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
           "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"}

#: A project of plain scripts: no packaging files.
SCRIPTS = {"job.py": "import sys\nprint('demo job', sys.argv[1:])\n"}
#: A packaged project (flit_core: small, in the local package index).
PACKAGED = {
    "pyproject.toml": '[build-system]\nrequires = ["flit_core>=3.2"]\n'
                      'build-backend = "flit_core.buildapi"\n\n[project]\nname = "demo"\n'
                      'version = "1.0"\ndescription = "a demo project"\n',
    "demo/__init__.py": '"""demo."""\n\nVALUE = 42\n',
}


def git(*args: str, cwd: Path | None = None) -> str:
    env = {**os.environ, **GIT_ENV}
    done = subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True,
                          text=True, timeout=30)
    return done.stdout.strip()


@dataclass
class Remote:
    """A bare repository and the work tree that pushes to it."""

    bare: Path
    work: Path
    commits: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"file://{self.bare}"

    def commit(self, files: Mapping[str, str], message: str = "change") -> str:
        for name, text in files.items():
            path = self.work / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        git("add", "-A", cwd=self.work)
        git("commit", "-q", "-m", message, cwd=self.work)
        git("push", "-q", "origin", "HEAD:refs/heads/main", cwd=self.work)
        return git("rev-parse", "HEAD", cwd=self.work)

    def tag(self, name: str) -> str:
        git("tag", name, cwd=self.work)
        git("push", "-q", "origin", f"refs/tags/{name}", cwd=self.work)
        sha = git("rev-parse", "HEAD", cwd=self.work)
        self.commits[name] = sha
        return sha


def make_remote(root: Path, files: Mapping[str, str] = SCRIPTS,
                tags: tuple[str, ...] = ("release/demo/1.0",)) -> Remote:
    bare = root / "remote.git"
    work = root / "work"
    git("init", "-q", "--bare", "-b", "main", str(bare))
    git("init", "-q", "-b", "main", str(work))
    git("remote", "add", "origin", str(bare), cwd=work)
    remote = Remote(bare, work)
    remote.commit(files, "first")
    for tag in tags:
        remote.tag(tag)
    return remote


@dataclass
class GitHttp:
    url: str
    requests: list[tuple[str, str, str]]  # (method, path, the user it authenticated)


@contextmanager
def git_http_server(repo_root: Path, username: str, password: str) -> Iterator[GitHttp]:
    """``git http-backend`` over HTTP on 127.0.0.1, every request behind basic auth with
    ``username``/``password``; yields the base URL (``http://127.0.0.1:port/``)."""
    backend = shutil.which("git-http-backend") or "/usr/lib/git-core/git-http-backend"
    expected = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
    seen: list[tuple[str, str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

        def do_GET(self) -> None:
            self._cgi()

        def do_POST(self) -> None:
            self._cgi()

        def _cgi(self) -> None:
            path, _, query = self.path.partition("?")
            if self.headers.get("Authorization") != expected:
                seen.append((self.command, path, ""))
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="git"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            seen.append((self.command, path, username))
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            env = {"GIT_PROJECT_ROOT": str(repo_root), "GIT_HTTP_EXPORT_ALL": "1",
                   "PATH_INFO": path, "QUERY_STRING": query,
                   "REQUEST_METHOD": self.command, "REMOTE_USER": username,
                   "REMOTE_ADDR": "127.0.0.1", "CONTENT_TYPE":
                   self.headers.get("Content-Type", ""), "CONTENT_LENGTH": str(len(body)),
                   "GATEWAY_INTERFACE": "CGI/1.1", "PATH": os.environ.get("PATH", ""),
                   "HTTP_GIT_PROTOCOL": self.headers.get("Git-Protocol", "")}
            if self.headers.get("Content-Encoding"):
                env["HTTP_CONTENT_ENCODING"] = self.headers["Content-Encoding"]
            done = subprocess.run([backend], input=body, env=env, capture_output=True,
                                  timeout=30)
            head, _, payload = done.stdout.partition(b"\r\n\r\n")
            status = 200
            headers: list[tuple[str, str]] = []
            for line in head.decode("latin-1").split("\r\n"):
                name, _, value = line.partition(":")
                if name.lower() == "status":
                    status = int(value.split()[0])
                elif name:
                    headers.append((name, value.strip()))
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield GitHttp(f"http://127.0.0.1:{server.server_address[1]}/", seen)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
