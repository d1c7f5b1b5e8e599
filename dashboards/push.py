"""Provision compactd's dashboards in Grafana through its HTTP API (grafana-client), idempotently.

Folder, Prometheus datasource and dashboards are addressed by uid: what exists and already matches is left alone,
what differs is overwritten, what is missing is created. A second push with nothing changed makes no writes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from compactd.dashboards.build import BUILDERS, JSON_DIR
from compactd.errors import CompactdError, DependencyUnavailable

FOLDER_UID = "compactd"
DATASOURCE_UID = "compactd-prometheus"
# Grafana adds these to a stored dashboard; they say nothing about its content.
_SERVER_FIELDS = ("id", "version")


@dataclass
class PushResult:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"created {', '.join(self.created) or 'nothing'}; updated {', '.join(self.updated) or 'nothing'}; "
            f"unchanged {', '.join(self.unchanged) or 'nothing'}"
        )


def _cause(exc: Exception) -> str:
    """The OS-level reason buried in a connection error ("Connection refused"), else the exception's name."""
    found = re.search(r"\[Errno -?\d+\] ([^'\")]+)", str(exc))
    return found.group(1).strip() if found else type(exc).__name__


def _missing(exc: Exception) -> bool:
    return getattr(exc, "status_code", None) == 404


def push(
    grafana_url: str,
    api_key: str | None = None,
    folder: str = "compactd",
    prometheus_url: str = "http://prometheus:9090",
    timeout_s: float = 10.0,
) -> PushResult:
    from grafana_client import GrafanaApi
    from grafana_client.client import GrafanaException

    api = GrafanaApi.from_url(grafana_url, credential=api_key, timeout=timeout_s)
    result = PushResult()
    try:
        _folder(api, folder, result)
        _datasource(api, prometheus_url, result)
        for name in BUILDERS:
            board = json.loads((JSON_DIR / f"{name}.json").read_text())
            _dashboard(api, board, result)
    except GrafanaException as exc:
        raise CompactdError(
            f"Grafana at {grafana_url} refused: {exc.message}; check --grafana-url / --api-key"
        ) from None
    except Exception as exc:  # connection refused, DNS, TLS: niquests' errors, not all of them OSError
        if isinstance(exc, OSError) or type(exc).__module__.startswith(("niquests", "urllib3")):
            raise DependencyUnavailable("Grafana", grafana_url, "--grafana-url", _cause(exc)) from None
        raise
    return result


def _folder(api: Any, title: str, result: PushResult) -> None:
    try:
        found = api.folder.get_folder(FOLDER_UID)
    except Exception as exc:
        if not _missing(exc):
            raise
        api.folder.create_folder(title, uid=FOLDER_UID)
        result.created.append(f"folder {title}")
        return
    if found.get("title") != title:
        api.folder.update_folder(FOLDER_UID, title=title, overwrite=True)
        result.updated.append(f"folder {title}")
    else:
        result.unchanged.append(f"folder {title}")


def _datasource(api: Any, url: str, result: PushResult) -> None:
    wanted = {"uid": DATASOURCE_UID, "name": "compactd Prometheus", "type": "prometheus", "access": "proxy", "url": url}
    try:
        found = api.datasource.get_datasource_by_uid(DATASOURCE_UID)
    except Exception as exc:
        if not _missing(exc):
            raise
        api.datasource.create_datasource(wanted)
        result.created.append("datasource")
        return
    if any(found.get(k) != v for k, v in wanted.items()):
        api.datasource.update_datasource(found["id"], {**found, **wanted})
        result.updated.append("datasource")
    else:
        result.unchanged.append("datasource")


def _dashboard(api: Any, board: dict[str, Any], result: PushResult) -> None:
    uid = board["uid"]
    try:
        found = api.dashboard.get_dashboard(uid)
    except Exception as exc:
        if not _missing(exc):
            raise
        found = None
    if found is not None:
        stored = {k: v for k, v in found.get("dashboard", {}).items() if k not in _SERVER_FIELDS}
        if stored == board and found.get("meta", {}).get("folderUid") == FOLDER_UID:
            result.unchanged.append(uid)
            return
    api.dashboard.update_dashboard({"dashboard": board, "overwrite": True, "folderUid": FOLDER_UID})
    (result.created if found is None else result.updated).append(uid)
