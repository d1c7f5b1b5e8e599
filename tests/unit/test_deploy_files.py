"""The deployment files agree with compactd: their arguments parse, their config validates, their timeouts outlast
the graceful stop, the checkpoint sits on the persistent volume. (deploy/submit itself runs in
tests/e2e/test_standalone_cluster.py; systemd and Kubernetes are not available to the suite.)"""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

import yaml

from compactd.app.cli import build_parser
from compactd.settings import Settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(DEPLOY / "systemd" / name)
    return parser


def test_job_unit_lets_the_graceful_stop_finish() -> None:
    service = unit("compactd.service")["Service"]
    argv = shlex.split(service["ExecStart"])
    assert argv[0].endswith("/deploy/submit") and argv[argv.index("--config") + 1].endswith(".yaml")
    assert service["KillMode"] == "mixed" and service["KillSignal"] == "SIGTERM"
    assert int(service["TimeoutStopSec"]) > Settings().stop_timeout_ms / 1000
    assert service["RestartPreventExitStatus"] == "2"


def test_agent_unit_runs_a_valid_agent_command() -> None:
    argv = shlex.split(unit("compactd-agent.service")["Service"]["ExecStart"])
    assert argv[0].endswith("/compactd")
    args = build_parser().parse_args(argv[1:])
    assert args.command == "agent" and args.log_dir == ["/var/lib/kafka/data"]


def test_spark_operator_application_matches_the_image_and_the_settings() -> None:
    docs = {d["kind"]: d for d in yaml.safe_load_all((DEPLOY / "k8s" / "compactd.yaml").read_text())}
    app, config = docs["SparkApplication"]["spec"], docs["ConfigMap"]["data"]["compactd.yaml"]
    settings = Settings(**yaml.safe_load(config))
    assert (app["type"], app["mode"]) == ("Python", "cluster")
    assert app["restartPolicy"]["type"] == "OnFailure" and app["restartPolicy"]["onFailureRetries"] > 0

    dockerfile = (DEPLOY / "k8s" / "Dockerfile").read_text()
    assert app["mainApplicationFile"] == f"local://{_copied_to(dockerfile, 'deploy/job.py')}"
    assert app["sparkConf"]["spark.pyspark.python"] in dockerfile

    from importlib.util import module_from_spec, spec_from_file_location

    spec = spec_from_file_location("deploy_job", DEPLOY / "job.py")
    assert spec and spec.loader
    job = module_from_spec(spec)
    spec.loader.exec_module(job)
    args = build_parser().parse_args(job.compactd_argv(app["arguments"]))
    driver = app["driver"]
    mounts = {m["name"]: m["mountPath"] for m in driver["volumeMounts"]}
    assert Path(args.config).parent == Path(mounts["config"])

    claims = {v["name"] for v in app["volumes"] if "persistentVolumeClaim" in v}
    on_claim = [path for name, path in mounts.items() if name in claims]
    assert any(Path(settings.checkpoint_dir).is_relative_to(p) for p in on_claim), "checkpoint must be persistent"
    assert {p["containerPort"] for p in driver["ports"]} == {settings.metrics_port}
    assert driver["annotations"]["prometheus.io/port"] == str(settings.metrics_port)
    assert driver["terminationGracePeriodSeconds"] > settings.stop_timeout_ms / 1000


def _copied_to(dockerfile: str, source: str) -> str:
    for line in dockerfile.splitlines():
        parts = line.split()
        if parts[:2] == ["COPY", source]:
            return parts[2]
    raise AssertionError(f"the Dockerfile does not COPY {source}")
