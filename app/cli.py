"""`compactd` command line. Exit status: 0 success, 2 bad usage or bad input, 1 other failure; errors are one line.

One module (~520 lines): the parser of every subcommand and the one place errors become a line and an exit status;
what each command does lives in its own module (app/*_cli.py, app/status.py, app/explain_cli.py, agent/, demo/).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import ValidationError

from compactd.errors import CompactdError, ConfigError, ForcedStop, InputError, UsageError

# Options that map to top-level settings (flag -> settings field); each also reads COMPACTD_<OPTION>.
JOB_OPTIONS = ("bootstrap_servers", "redis_url", "checkpoint_dir", "trigger_interval_ms", "metrics_port")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

log = logging.getLogger("compactd.cli")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=36, width=110)


def _env(name: str) -> str | None:
    return os.environ.get(f"COMPACTD_{name.upper()}")


def _setting_default(name: str) -> Any:
    from compactd.settings import Settings

    return Settings.model_fields[name].default


def _job_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=_env("config"), help="YAML config file (env COMPACTD_CONFIG)")
    for opt in JOB_OPTIONS:
        p.add_argument(
            f"--{opt.replace('_', '-')}",
            dest=opt,
            default=None,
            help=f"env COMPACTD_{opt.upper()}; default {_setting_default(opt)!r} unless the config file sets it",
        )


def _log_level(value: str) -> str:
    level = value.upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"invalid log level {value!r}: choose from {', '.join(LOG_LEVELS)}")
    return level


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="compactd",
        description="Bounded compaction lag (KIP-354) and consumed retention (KIP-68) for Kafka.",
        formatter_class=_Help,
    )
    parser.add_argument(
        "--log-level", type=_log_level, default=_env("log_level") or "INFO", help="DEBUG also keeps Spark's own logs"
    )
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND")

    run = sub.add_parser("run", help="the Structured Streaming job", formatter_class=_Help)
    _job_flags(run)
    run.add_argument(
        "--once",
        action="store_true",
        default=_env("once") == "1",
        help="available-now trigger: process what is there, evaluate every partition, exit 0",
    )

    status = sub.add_parser("status", help="table of partitions", formatter_class=_Help)
    _job_flags(status)
    status.add_argument("--json", action="store_true", help="JSON lines instead of a table")

    doctor = sub.add_parser(
        "doctor",
        help="check the principal's ACLs against what compactd needs, before dry.run false (changes nothing)",
        formatter_class=_Help,
    )
    _job_flags(doctor)
    doctor.add_argument(
        "--topic", action="append", default=[], help="a topic to check (default: those the thresholds name, or all)"
    )

    explain = sub.add_parser(
        "explain", help="why a partition is not compacted or deleted, and what happens next", formatter_class=_Help
    )
    _job_flags(explain)
    explain.add_argument("target", metavar="TOPIC[/PARTITION]", help="a partition, or every partition of a topic")
    explain.add_argument("--json", action="store_true", help="one JSON object per partition instead of text")
    explain.add_argument(
        "--limit", type=int, default=20, help="a topic: its N worst partitions, then how many more there are; 0 = all"
    )

    compact = sub.add_parser(
        "compact",
        help="compact a topic into its view now (`compact TOPIC`), or show the last run (`compact status TOPIC`)",
        formatter_class=_Help,
    )
    _job_flags(compact)
    compact.add_argument("words", nargs="+", metavar="[status] TOPIC", help="a topic, or `status` and a topic")
    compact.add_argument(
        "--strategy", default=None, help="offset|timestamp|header for this run (default: the topic's config)"
    )
    compact.add_argument("--header", default=None, help="header name for --strategy header")
    over = compact.add_mutually_exclusive_group()
    over.add_argument(
        "--accept-gap",
        action="store_true",
        help="publish although the source lost offsets past the view's horizon: built from the view plus what the "
        "source still holds, the gap (ranges, time, who) recorded in the manifest",
    )
    over.add_argument("--rebuild", action="store_true", help="start a new view from the source alone")

    read = sub.add_parser("read", help="read a topic as a compacted reader sees it", formatter_class=_Help)
    _job_flags(read)
    read.add_argument("topic")
    read.add_argument(
        "--compacted", action="store_true", help="the view, then the source from its horizon (required for now)"
    )
    read.add_argument("--table", action="store_true", help="one record per live key instead")

    demo = sub.add_parser(
        "demo", help="Apache Kafka + Redis + real groups + the agent + the job, live", formatter_class=_Help
    )
    demo.add_argument(
        "--duration", type=float, default=float(_env("duration") or 0), help="stop after this many seconds; 0 = Ctrl-C"
    )
    demo.add_argument("--workdir", default=_env("workdir"), help="keep demo data here (default: a temp dir, removed)")
    demo.add_argument(
        "--until-closed",
        action="store_true",
        help="stop once a compaction and a delete have both been carried out and answered (--duration still caps)",
    )
    demo.add_argument(
        "--nodes",
        type=int,
        default=int(_env("nodes") or 1),
        help="Kafka nodes (3: replication factor 3, an agent per node, and the node leading most partitions killed "
        "with -9 and started again while the demo runs)",
    )
    demo.add_argument(
        "--render",
        default=None,
        metavar="DIR",
        help="also run a local Prometheus (Debian package) and, at the end, draw the dashboards to DIR/*.png",
    )

    agent = sub.add_parser(
        "agent",
        help="publish segment events from Kafka log directories, or (--admin) commits and retention facts from the "
        "Admin API where compactd is only a client",
        formatter_class=_Help,
    )
    agent.add_argument(
        "--log-dir",
        action="append",
        default=(_env("log_dir") or "").split(",") if _env("log_dir") else None,
        help="a broker log.dirs entry (repeat for each; env COMPACTD_LOG_DIR, comma-separated)",
    )
    agent.add_argument(
        "--admin",
        action="store_true",
        help="one agent per cluster, on any host with client access: poll group offsets and log offsets through the "
        "Admin API (managed Kafka: no log directories, no __consumer_offsets)",
    )
    agent.add_argument("--commits-topic", default=_env("commits_topic"), help="--admin: default topics.commits")
    agent.add_argument(
        "--slice-ms",
        type=int,
        default=int(_env("slice_ms") or 60_000),
        help="--admin: offsets written within this long form one time slice (the retention rules' granularity)",
    )
    agent.add_argument(
        "--group-grace-ms",
        type=int,
        default=int(_env("group_grace_ms") or 300_000),
        help="--admin: a group the cluster no longer lists is deleted after this long (one missing answer is not gone)",
    )
    agent.add_argument("--config", default=_env("config"), help="YAML config: bootstrap_servers, kafka:, topics:")
    agent.add_argument(
        "--bootstrap-servers", default=None, help="env COMPACTD_BOOTSTRAP_SERVERS; default 127.0.0.1:9092"
    )
    agent.add_argument("--segments-topic", default=_env("segments_topic"), help="default: topics.segments")
    agent.add_argument("--interval-ms", type=int, default=int(_env("interval_ms") or 10_000), help="between scans")
    agent.add_argument("--once", action="store_true", help="scan once, publish, exit")
    agent.add_argument(
        "--full-every-ms",
        type=int,
        default=int(_env("full_every_ms") or 3_600_000),
        help="publish every segment on disk again this often (a rebuilt or reset state learns them all)",
    )

    segments = sub.add_parser("segments", help="Kafka log directories")
    seg_sub = segments.add_subparsers(dest="segments_command", required=True, parser_class=_Parser)
    inspect = seg_sub.add_parser("inspect", help="JSON line per segment file")
    inspect.add_argument("dir")

    offsets = sub.add_parser("offsets", help="__consumer_offsets records")
    off_sub = offsets.add_subparsers(dest="offsets_command", required=True, parser_class=_Parser)
    decode = off_sub.add_parser("decode", help="decode one record given as hex")
    decode.add_argument("--key", required=True)
    decode.add_argument("--value", default=None, help="omit for a tombstone")

    cfg = sub.add_parser("config", help="change or show thresholds at runtime")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True, parser_class=_Parser)
    get = cfg_sub.add_parser(
        "get", help="effective thresholds for a scope, as the job applies them", formatter_class=_Help
    )
    _job_flags(get)
    get.add_argument("scope", nargs="?", default="global", help="global, topic:<name> or partition:<topic>/<n>")
    put = cfg_sub.add_parser(
        "set", help="validate, sign and produce a config event with the next version", formatter_class=_Help
    )
    _job_flags(put)
    put.add_argument("scope", help="global, topic:<name> or partition:<topic>/<n>")
    put.add_argument("assignments", nargs="*", metavar="KEY=VALUE", help='VALUE as JSON (5000, false, ["a.*"]) or text')
    put.add_argument("--unset", action="append", default=[], metavar="KEY", help="back to the file's (or lower) scope")

    dash = sub.add_parser("dashboards", help="Grafana dashboards as code: build, push, render")
    dash_sub = dash.add_subparsers(dest="dashboards_command", required=True, parser_class=_Parser)
    build = dash_sub.add_parser("build", help="write the dashboards' JSON", formatter_class=_Help)
    build.add_argument("--out", default=None, help="directory (default: the package's dashboards/json)")
    push = dash_sub.add_parser("push", help="create or update folder, datasource, dashboards", formatter_class=_Help)
    push.add_argument("--grafana-url", required=_env("grafana_url") is None, default=_env("grafana_url"))
    push.add_argument(
        "--api-key", default=_env("grafana_api_key"), help="service account token (env COMPACTD_GRAFANA_API_KEY)"
    )
    push.add_argument("--folder", default="compactd", help="folder title (uid compactd)")
    push.add_argument(
        "--prometheus-url",
        default=_env("prometheus_url") or "http://prometheus:9090",
        help="URL Grafana uses for the compactd Prometheus datasource",
    )
    render = dash_sub.add_parser(
        "render", help="draw a dashboard's panels from Prometheus to PNG", formatter_class=_Help
    )
    render.add_argument("--prometheus-url", default=_env("prometheus_url") or "http://127.0.0.1:9090")
    render.add_argument("--out", default="docs/img", help="directory for <dashboard>.png")
    render.add_argument("--dashboard", default="overview", choices=["overview", "partition", "health"])
    render.add_argument("--range-s", type=float, default=3600.0, help="time range drawn, seconds back from now")
    render.add_argument("--var", action="append", default=[], metavar="NAME=VALUE", help="dashboard variable")
    return parser


def _settings(args: argparse.Namespace, options: Sequence[str] = JOB_OPTIONS) -> Any:
    from compactd.settings import load_settings

    flags = {opt: getattr(args, opt, None) for opt in options}
    return load_settings(args.config, **flags)


class StopEvent(threading.Event):
    """Set by the first SIGTERM/SIGINT; `forced` holds the second (`errors.forced_by`)."""

    forced: ForcedStop | None = None


def _stop_on_signals() -> StopEvent:
    """First SIGTERM/SIGINT: stop gracefully (finish the batch, drain the outbox). Second: leave at once."""
    stop = StopEvent()

    def on_signal(signum: int, _frame: object) -> None:
        if stop.is_set():
            stop.forced = ForcedStop(
                f"stopped by a second {signal.Signals(signum).name} before the running batch finished; "
                "the checkpoint replays it on the next start"
            )
            raise stop.forced
        log.info("%s: stopping after the running batch (send it again to stop at once)", signal.Signals(signum).name)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    return stop


def cmd_run(args: argparse.Namespace) -> int:
    from compactd.daemon.application import Application

    stop = _stop_on_signals()
    settings = _settings(args)
    factory = args.app_factory or Application
    with factory(settings, verbose=args.log_level == "DEBUG") as app:
        summary = app.run(once=args.once, stop=stop)
    if args.once:
        print(f"compactd run --once: {summary}", flush=True)
    else:
        log.info("stopped: %s", summary)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from compactd.app.status import print_status

    print_status(_settings(args), as_json=args.json)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """One line per operation compactd needs: granted, missing or unknown, and what needs it; exit 1 when any is
    missing."""
    from compactd.app.acls import check
    from compactd.kafka.admin import check_reachable

    settings = _settings(args)
    check_reachable(settings.kafka_connection())
    found = check(settings, args.topic)
    for f in found:
        print(f.line(), flush=True)
    missing = [f for f in found if f.state == "missing"]
    unknown = sum(f.state == "unknown" for f in found)
    print(f"compactd doctor: {len(found) - len(missing) - unknown} granted, {len(missing)} missing, {unknown} unknown")
    return 1 if missing else 0


def cmd_explain(args: argparse.Namespace) -> int:
    from compactd.app.explain_cli import print_explain

    print_explain(_settings(args), args.target, as_json=args.json, limit=args.limit)
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from compactd.app.config_cli import config_get, config_set

    settings = _settings(args)
    if args.config_command == "set":
        version = config_set(settings, args.scope, args.assignments, args.unset)
        print(version)
        return 0
    print(json.dumps(config_get(settings, args.scope), sort_keys=True))
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    from compactd.app.compact_cli import compact, compact_status

    words = list(args.words)
    if words[0] == "status" and len(words) == 2:
        return compact_status(_settings(args), words[1])
    if len(words) != 1:
        raise UsageError(
            "usage: compactd compact TOPIC [--strategy S] [--header NAME] [--accept-gap | --rebuild] "
            "| compactd compact status TOPIC"
        )
    return compact(_settings(args), words[0], args.strategy, args.header, args.accept_gap, args.rebuild)


def cmd_read(args: argparse.Namespace) -> int:
    from compactd.app.compact_cli import read_compacted

    if not args.compacted:
        raise UsageError("compactd read reads compacted topics only: add --compacted")
    return read_compacted(_settings(args), args.topic, args.table)


def cmd_demo(args: argparse.Namespace) -> int:
    from compactd.demo.demo import run_demo

    return run_demo(
        duration_s=args.duration,
        workdir=args.workdir,
        render_dir=args.render,
        until_closed=args.until_closed,
        nodes=args.nodes,
    )


def cmd_agent(args: argparse.Namespace) -> int:
    from pathlib import Path

    from compactd.agent.agent import KafkaPublisher, SegmentAgent, run_agent
    from compactd.agent.leaders import node_id
    from compactd.kafka.admin import check_reachable
    from compactd.settings import load_settings

    if args.admin:
        return _admin_agent(args)
    if not args.log_dir:
        raise UsageError("agent: give --log-dir (beside a broker) or --admin (any host with client access)")
    dirs = [Path(d) for d in args.log_dir]
    for d in dirs:
        if not d.is_dir():
            raise UsageError(f"log dir not found: {d} (--log-dir)")
    settings = load_settings(args.config, bootstrap_servers=args.bootstrap_servers)
    conn = settings.kafka_connection()
    check_reachable(conn)
    publisher = KafkaPublisher(conn, args.segments_topic or settings.topics.segments)
    nodes = {node_id(d) for d in dirs}
    if len(nodes) > 1:
        raise UsageError(f"the log dirs belong to different brokers ({sorted(map(str, nodes))}): one agent per broker")
    node = nodes.pop()
    if node is None:  # a log dir without meta.properties (a copy, an old fixture): every partition on it
        log.warning("no meta.properties in %s: publishing every partition, not only those this broker leads", dirs[0])
    try:
        agent = (
            SegmentAgent(dirs, full_every_ms=args.full_every_ms)
            if node is None
            else SegmentAgent.beside(dirs, conn, node, full_every_ms=args.full_every_ms)
        )
        run_agent(agent, publisher, args.interval_ms / 1000, _stop_on_signals(), once=args.once)
    finally:
        publisher.close()
    return 0


def _admin_agent(args: argparse.Namespace) -> int:
    from compactd.agent.admin_agent import AdminAgent, AdminPublisher, run_admin_agent
    from compactd.agent.admin_poll import AdminPoll
    from compactd.kafka.admin import check_reachable, ensure_topics
    from compactd.kafka.groups import require_every_group
    from compactd.policy.thresholds import group_counts, parse_scope, resolve, resolve_global
    from compactd.settings import load_settings

    settings = load_settings(args.config, bootstrap_servers=args.bootstrap_servers)
    conn = settings.kafka_connection()
    check_reachable(conn)
    require_every_group(conn)  # what it does not list, no job hears of
    layers = settings.thresholds
    scopes = [resolve_global(layers)] + [
        resolve(layers, topic, partition)
        for scope in layers
        for kind, topic, partition in [parse_scope(scope)]
        if kind != "global" and topic is not None
    ]

    def counts(group: str) -> bool:  # groups.include / groups.exclude: a group counted in no scope is not fetched
        return any(group_counts(group, th) for th in scopes)

    poll = AdminPoll(args.slice_ms, args.group_grace_ms, counts)
    agent = AdminAgent(conn, poll, frozenset(settings.own_topics()))
    t, own = settings.topics, settings.own_topic_configs()
    segments, commits = args.segments_topic or t.segments, args.commits_topic or t.commits
    if settings.create_topics:  # the agent may start before the job: the topics it writes, as the job makes them
        configs = {commits: own[t.commits], t.agent: own[t.agent]}
        ensure_topics(
            conn, [segments, commits, t.agent], configs=configs, replication_factor=settings.topics_replication_factor
        )
    publisher = AdminPublisher(conn, segments, commits, t.agent)
    known = agent.resume(commits)
    if known:
        log.info("admin agent: %d groups as earlier runs published them (%s)", known, commits)
    try:
        run_admin_agent(
            agent, publisher, args.interval_ms / 1000, _stop_on_signals(), once=args.once, cluster=settings.cluster
        )
    finally:
        publisher.close()
        agent.close()
    return 0


def cmd_segments(args: argparse.Namespace) -> int:
    from pathlib import Path

    from compactd.agent.logdir import scan_log_dir

    path = Path(args.dir)
    if not path.is_dir():
        raise UsageError(f"not a directory: {path}")
    for seg in scan_log_dir(path):
        print(json.dumps(seg.to_json()))
    return 0


def cmd_offsets(args: argparse.Namespace) -> int:
    from compactd.codec.offsets import decode_record

    try:
        key = bytes.fromhex(args.key)
        value = None if args.value is None else bytes.fromhex(args.value)
    except ValueError as exc:
        raise InputError(f"bad hex: {exc}") from None
    print(json.dumps(decode_record(key, value)))
    return 0


def cmd_dashboards(args: argparse.Namespace) -> int:
    from pathlib import Path

    if args.dashboards_command == "build":
        from compactd.dashboards.build import JSON_DIR, write_all

        for path in write_all(Path(args.out) if args.out else JSON_DIR):
            print(path)
        return 0
    if args.dashboards_command == "push":
        from compactd.dashboards.push import push

        result = push(args.grafana_url, args.api_key, args.folder, args.prometheus_url)
        print(result.line())
        return 0
    from compactd.dashboards.render import render

    variables = dict(v.split("=", 1) for v in args.var if "=" in v)
    print(render(args.prometheus_url, Path(args.out), args.dashboard, args.range_s, variables))
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "dashboards": cmd_dashboards,
    "run": cmd_run,
    "status": cmd_status,
    "explain": cmd_explain,
    "doctor": cmd_doctor,
    "config": cmd_config,
    "demo": cmd_demo,
    "compact": cmd_compact,
    "read": cmd_read,
    "agent": cmd_agent,
    "segments": cmd_segments,
    "offsets": cmd_offsets,
}


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    # librdkafka's own lines (through compactd.kafka.config) only from WARNING up, unless debugging
    logging.getLogger("compactd.librdkafka").setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)
    if level != "DEBUG":
        logging.getLogger("py4j").setLevel(logging.CRITICAL)
        for handler in logging.getLogger().handlers:
            handler.addFilter(_not_py4j)


def _not_py4j(record: logging.LogRecord) -> bool:
    """py4j logs a failed call during Spark's shutdown through the root logger (`logging.info(..., exc_info=True)`
    in java_gateway.py), with a traceback: compactd reports the failure itself, in one line."""
    return "/py4j/" not in record.pathname.replace("\\", "/")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _validation_line(exc: ValidationError) -> str:
    err = exc.errors(include_url=False)[0]
    loc = ".".join(str(p) for p in err["loc"]) or exc.title
    return f"invalid setting {loc}: {err['msg']}"


def main(argv: Sequence[str] | None = None, app_factory: Callable[..., Any] | None = None) -> int:
    """The command line; `app_factory` lets tests wrap the Application (a probe that crashes it, say)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        args.app_factory = app_factory
        if args.command is None:
            parser.print_help(sys.stderr)
            return 2
        configure_logging(args.log_level)
        return COMMANDS[args.command](args)
    except CompactdError as exc:
        print(f"compactd: error: {_one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except ValidationError as exc:
        print(f"compactd: error: {_one_line(_validation_line(exc))}", file=sys.stderr)
        return ConfigError.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        print(f"compactd: error: {type(exc).__name__}: {_one_line(str(exc))[:500]}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
