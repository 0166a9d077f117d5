"""A stand-in for the Hugging Face Hub on 127.0.0.1: the endpoints `create_repo` and
`upload_folder` call (with `HF_HUB_DISABLE_XET=1`, small files go inline in the commit), recording
every request so tests can check on the server side what arrived and with which headers."""

from __future__ import annotations

import base64
import gzip
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class FakeHub:
    requests: list[Request] = field(default_factory=list)
    repos: dict[str, dict] = field(default_factory=dict)  # repo_id -> create payload
    files: dict[str, dict[str, bytes]] = field(default_factory=dict)  # repo_id -> path -> content
    commits: list[dict] = field(default_factory=list)
    validated_cards: list[str] = field(default_factory=list)
    fail_commits: int = 0  # answer this many commits with a 500 (an upload interrupted half-way)
    url: str = ""

    def start(self) -> "FakeHub":
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output clean
                pass

            def do_GET(self):
                self._handle()

            def do_POST(self):
                self._handle()

            def do_HEAD(self):
                self._handle()

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                hub.requests.append(Request(self.command, self.path, dict(self.headers.items()), body))
                status, payload = hub.answer(self.command, self.path, body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def answer(self, method: str, path: str, body: bytes) -> tuple[int, dict]:
        path = path.split("?")[0]
        if method == "POST" and path == "/api/repos/create":
            req = json.loads(body)
            repo_id = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
            if repo_id in self.repos:
                return 409, {"error": "You already created this model repo", "url": f"{self.url}/{repo_id}"}
            self.repos[repo_id] = req
            self.files[repo_id] = {}
            return 200, {"url": f"{self.url}/{repo_id}", "name": repo_id}
        if method == "POST" and path == "/api/validate-yaml":  # upload_folder checks a README's front matter
            content = json.loads(body)["content"]
            self.validated_cards.append(content)
            lines = content.splitlines()
            if not lines or lines[0] != "---" or "---" not in lines[1:]:
                return 400, {"errors": [{"message": "no YAML front matter"}]}
            return 200, {"errors": [], "warnings": []}
        m = re.fullmatch(r"/api/models/(.+)/preupload/([^/]+)", path)
        if method == "POST" and m:
            if m.group(1) not in self.repos:
                return 404, {"error": "Repository not found"}
            files = json.loads(body)["files"]
            return 200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]}
        m = re.fullmatch(r"/api/models/(.+)/commit/([^/]+)", path)
        if method == "POST" and m:
            repo_id = m.group(1)
            if repo_id not in self.repos:
                return 404, {"error": "Repository not found"}
            if self.fail_commits > 0:
                self.fail_commits -= 1
                return 500, {"error": "Internal Error: upload interrupted"}
            lines = [json.loads(line) for line in body.splitlines() if line.strip()]
            added = {}
            for line in lines:
                if line["key"] == "file":
                    added[line["value"]["path"]] = base64.b64decode(line["value"]["content"])
            self.files[repo_id].update(added)
            oid = f"{len(self.commits) + 1:040x}"
            self.commits.append({"repo_id": repo_id, "header": lines[0]["value"], "files": sorted(added)})
            return 200, {"commitUrl": f"{self.url}/{repo_id}/commit/{oid}", "commitOid": oid, "success": True}
        return 404, {"error": f"fake hub does not serve {method} {path}"}
