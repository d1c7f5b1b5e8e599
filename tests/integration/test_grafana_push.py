"""`compactd dashboards push` against a small local HTTP server that answers like Grafana and records the calls.

No Grafana server can be installed here; this server keeps folders, datasources and dashboards by uid the way
Grafana's HTTP API does (404 when missing, id/version added on save), so idempotence is tested for real.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from compactd.app.cli import main
from compactd.dashboards.build import BUILDERS, load


class FakeGrafana(BaseHTTPRequestHandler):
    calls: list[tuple[str, str, Any]]
    store: dict[str, dict[str, Any]]

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, code: int, body: Any) -> None:
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n)) if n else None

    def _authorized(self) -> bool:
        if self.headers.get("Authorization") == "Bearer test-token":
            return True
        self._reply(401, {"message": "Unauthorized"})
        return False

    def do_GET(self) -> None:
        self.calls.append(("GET", self.path, None))
        if not self._authorized():
            return
        kind, _, uid = self.path.removeprefix("/api/").partition("/")
        uid = uid.removeprefix("uid/")
        found = self.store[kind].get(uid)
        if found is None:
            self._reply(404, {"message": "not found"})
        else:
            self._reply(200, found)

    def do_POST(self) -> None:
        body = self._body()
        self.calls.append(("POST", self.path, body))
        if not self._authorized():
            return
        if self.path == "/api/folders":
            self.store["folders"][body["uid"]] = {"uid": body["uid"], "title": body["title"], "id": 1}
        elif self.path == "/api/datasources":
            self.store["datasources"][body["uid"]] = {**body, "id": 7}
        elif self.path == "/api/dashboards/db":
            board = body["dashboard"]
            version = self.store["dashboards"].get(board["uid"], {}).get("dashboard", {}).get("version", 0) + 1
            self.store["dashboards"][board["uid"]] = {
                "dashboard": {**board, "id": 40 + version, "version": version},
                "meta": {"folderUid": body["folderUid"]},
            }
        self._reply(200, {"status": "success"})


@pytest.fixture
def grafana() -> Iterator[tuple[str, type[FakeGrafana]]]:
    handler = type(
        "Handler", (FakeGrafana,), {"calls": [], "store": {"folders": {}, "datasources": {}, "dashboards": {}}}
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()


def test_push_creates_everything_once_and_a_second_push_changes_nothing(grafana, capsys) -> None:
    url, server = grafana
    flags = ["--grafana-url", url, "--api-key", "test-token", "--prometheus-url", "http://prom:9090"]
    assert main(["dashboards", "push", *flags]) == 0
    assert "created folder compactd, datasource, compactd-overview" in capsys.readouterr().out
    writes = [(m, p, b) for m, p, b in server.calls if m != "GET"]
    assert [(m, p) for m, p, _ in writes] == [
        ("POST", "/api/folders"),
        ("POST", "/api/datasources"),
        ("POST", "/api/dashboards/db"),
        ("POST", "/api/dashboards/db"),
        ("POST", "/api/dashboards/db"),
    ]
    assert writes[0][2] == {"title": "compactd", "uid": "compactd"}
    assert writes[1][2] == {
        "uid": "compactd-prometheus",
        "name": "compactd Prometheus",
        "type": "prometheus",
        "access": "proxy",
        "url": "http://prom:9090",
    }
    boards = [b for _, p, b in writes if p == "/api/dashboards/db"]
    assert [b["dashboard"] for b in boards] == [load(n) for n in BUILDERS]
    assert all(b["overwrite"] is True and b["folderUid"] == "compactd" for b in boards)
    gets = [p for m, p, _ in server.calls if m == "GET"]
    assert gets == [
        "/api/folders/compactd",
        "/api/datasources/uid/compactd-prometheus",
        "/api/dashboards/uid/compactd-overview",
        "/api/dashboards/uid/compactd-partition",
        "/api/dashboards/uid/compactd-health",
    ]

    server.calls.clear()
    assert main(["dashboards", "push", *flags]) == 0
    assert capsys.readouterr().out.strip() == (
        "created nothing; updated nothing; unchanged folder compactd, datasource, compactd-overview, "
        "compactd-partition, compactd-health"
    )
    assert [m for m, _, _ in server.calls] == ["GET"] * 5

    # a dashboard changed in Grafana by hand is put back, and only that one
    server.store["dashboards"]["compactd-health"]["dashboard"]["title"] = "edited"
    server.calls.clear()
    assert main(["dashboards", "push", *flags]) == 0
    assert [(m, p) for m, p, _ in server.calls if m != "GET"] == [("POST", "/api/dashboards/db")]


def test_refused_push_is_one_line(grafana, capsys) -> None:
    url, _ = grafana
    assert main(["dashboards", "push", "--grafana-url", url, "--api-key", "wrong"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"compactd: error: Grafana at {url} refused: Unauthorized; check --grafana-url / --api-key"
