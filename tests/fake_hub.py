"""A local Hugging Face Hub on loopback for tests: huggingface_hub talks to it through HF_ENDPOINT.

It serves what huggingface_hub's own downloads ask for (repo info, the recursive tree, file resolves with
HEAD, GET and byte ranges), answers a gated repo's files 403 with the hub's `X-Error-Code: GatedRepo` unless
the request carries the right token, and an unknown repo 401 `RepoNotFound`. Every file GET is logged, so a
test can tell whether any byte moved.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    gated_token: str | None = None  # set: the files need "Authorization: Bearer <this>"
    sha: str = field(default="")

    def __post_init__(self):
        digest = hashlib.sha1(json.dumps(sorted((k, len(v)) for k, v in self.files.items())).encode())
        self.sha = self.sha or digest.hexdigest()

    @classmethod
    def from_dir(cls, root: Path, **kw) -> "FakeRepo":
        return cls({p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()},
                   **kw)


class FakeHub:
    def __init__(self):
        self.repos: dict[str, FakeRepo] = {}
        self.downloads: list[str] = []  # "repo/path" of every whole-file GET
        self.ranged_reads: list[str] = []  # "repo/path" of byte-range GETs (safetensors header reads)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub._serve(self, body=False)

            def do_GET(self):
                hub._serve(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ---- the routes ----------------------------------------------------------------------------

    def _serve(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlparse(h.path).path)
        api = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        tree = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        repo_id = (api or tree or resolve).group(1) if (api or tree or resolve) else None
        repo = self.repos.get(repo_id)
        if repo is None:
            return self._error(h, 401, "RepoNotFound", f"Repository Not Found for url: {h.path}.")
        if api:
            return self._json(h, {"id": repo_id, "modelId": repo_id, "sha": repo.sha, "private": False,
                                  "gated": "manual" if repo.gated_token else False, "tags": [], "downloads": 0,
                                  "siblings": [{"rfilename": p, "size": len(b), "blobId": self._oid(b)}
                                               for p, b in repo.files.items()]}, body)
        if tree:
            prefix = (tree.group(3) or "").strip("/")
            return self._json(h, [{"type": "file", "oid": self._oid(b), "size": len(b), "path": p}
                                  for p, b in repo.files.items() if not prefix or p.startswith(prefix + "/")], body)
        if repo.gated_token and h.headers.get("Authorization") != f"Bearer {repo.gated_token}":
            return self._error(h, 403, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access "
                                                    "to it and be authenticated to access it. Please log in.")
        name = resolve.group(3)
        if name not in repo.files:
            return self._error(h, 404, "EntryNotFound", f"{name} does not exist on revision {resolve.group(2)}")
        data = repo.files[name]
        start, end = 0, len(data) - 1
        ranged = re.fullmatch(r"bytes=(\d+)-(\d*)", h.headers.get("Range", ""))
        if ranged:
            start, end = int(ranged.group(1)), min(end, int(ranged.group(2) or end))
        chunk = data[start:end + 1]
        h.send_response(206 if ranged else 200)
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Content-Length", str(len(chunk)))
        h.send_header("X-Repo-Commit", repo.sha)
        h.send_header("ETag", f'"{self._oid(data)}"')
        if ranged:
            h.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        h.end_headers()
        if body:
            (self.ranged_reads if ranged else self.downloads).append(f"{repo_id}/{name}")
            h.wfile.write(chunk)

    @staticmethod
    def _oid(data: bytes) -> str:
        return hashlib.sha1(data).hexdigest()

    @staticmethod
    def _json(h, value, body: bool) -> None:
        data = json.dumps(value).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if body:
            h.wfile.write(data)

    @staticmethod
    def _error(h, status: int, code: str, message: str) -> None:
        data = json.dumps({"error": message}).encode()
        h.send_response(status)
        h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", message)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
