"""`compactd` command line. Exit status: 0 success, 2 bad usage or bad input, 1 other failure."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence

from pydantic import ValidationError

from policy.config import ConfigError

# Options that map to top-level settings (flag -> settings field); each also reads COMPACTD_<OPTION>.
JOB_OPTIONS = ("bootstrap_servers", "redis_url", "checkpoint_dir", "trigger_interval_ms", "metrics_port")


class UsageError(Exception):
    """Bad usage or bad input: exit 2 with one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def _env_default(name: str) -> str | None:
    return os.environ.get(f"COMPACTD_{name.upper()}")


def _job_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=_env_default("config"), help="YAML config file (COMPACTD_CONFIG)")
    for opt in JOB_OPTIONS:
        p.add_argument(f"--{opt.replace('_', '-')}", dest=opt, default=None, help=f"(COMPACTD_{opt.upper()})")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="compactd", description="Bounded compaction lag and consumed retention for Kafka.")
    parser.add_argument("--log-level", default=os.environ.get("COMPACTD_LOG_LEVEL", "INFO"))
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="the Structured Streaming job")
    _job_flags(run)
    run.add_argument(
        "--once",
        action="store_true",
        default=_env_default("once") == "1",
        help="available-now trigger: process what is there, evaluate every deadline, exit 0",
    )

    status = sub.add_parser("status", help="table of partitions")
    _job_flags(status)
    status.add_argument("--json", action="store_true", help="JSON lines instead of a table")

    demo = sub.add_parser("demo", help="embedded broker + Redis + simulated cluster + the job, live")
    demo.add_argument(
        "--duration",
        type=float,
        default=float(_env_default("duration") or 0),
        help="stop after this many seconds (0 = until Ctrl-C)",
    )
    demo.add_argument("--workdir", default=_env_default("workdir"), help="keep demo data here (default: temp dir)")

    agent = sub.add_parser("agent", help="publish segment events from Kafka log directories")
    agent.add_argument(
        "--log-dir",
        action="append",
        required=_env_default("log_dir") is None,
        default=_env_default("log_dir").split(",") if _env_default("log_dir") else None,
    )
    agent.add_argument("--bootstrap-servers", default=_env_default("bootstrap_servers") or "127.0.0.1:9092")
    agent.add_argument("--segments-topic", default=_env_default("segments_topic") or "compactd.segments")
    agent.add_argument("--interval-ms", type=int, default=int(_env_default("interval_ms") or 10_000))
    agent.add_argument("--once", action="store_true", help="scan once, publish, exit")

    segments = sub.add_parser("segments", help="Kafka log directories")
    seg_sub = segments.add_subparsers(dest="segments_command", required=True, parser_class=_Parser)
    inspect = seg_sub.add_parser("inspect", help="JSON line per segment file")
    inspect.add_argument("dir")

    offsets = sub.add_parser("offsets", help="__consumer_offsets records")
    off_sub = offsets.add_subparsers(dest="offsets_command", required=True, parser_class=_Parser)
    decode = off_sub.add_parser("decode", help="decode one record given as hex")
    decode.add_argument("--key", required=True)
    decode.add_argument("--value", default=None, help="omit for a tombstone")

    cfg = sub.add_parser("config", help="show configuration")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True, parser_class=_Parser)
    get = cfg_sub.add_parser("get", help="effective thresholds for a scope")
    _job_flags(get)
    get.add_argument("scope", nargs="?", default="global")
    return parser


def _settings(args: argparse.Namespace):
    from streaming.settings import load_settings

    flags = {opt: getattr(args, opt, None) for opt in JOB_OPTIONS}
    return load_settings(args.config, **flags)


def cmd_run(args: argparse.Namespace) -> int:
    from streaming.job import Job

    settings = _settings(args)
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
    with Job(settings) as job:
        job.run(once=args.once, stop=stop)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from streaming.status import print_status

    print_status(_settings(args), as_json=args.json)
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    import json

    from policy.config import parse_scope, resolve

    settings = _settings(args)
    kind, topic, partition = parse_scope(args.scope)
    if kind == "global":
        values = settings.thresholds.get("global", {})
    else:
        assert topic is not None
        values = resolve(settings.thresholds, topic, partition).model_dump(by_alias=True)
    print(json.dumps({"scope": args.scope, "values": values}, sort_keys=True))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from streaming.demo import run_demo

    return run_demo(duration_s=args.duration, workdir=args.workdir)


def cmd_agent(args: argparse.Namespace) -> int:
    from pathlib import Path

    from streaming.agent import KafkaPublisher, SegmentAgent, run_agent

    dirs = [Path(d) for d in args.log_dir]
    for d in dirs:
        if not d.is_dir():
            raise UsageError(f"log dir not found: {d}")
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
    run_agent(
        SegmentAgent(dirs),
        KafkaPublisher(args.bootstrap_servers, args.segments_topic),
        args.interval_ms / 1000,
        stop,
        once=args.once,
    )
    return 0


def cmd_segments(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from streaming.logdir import scan_log_dir

    path = Path(args.dir)
    if not path.is_dir():
        raise UsageError(f"not a directory: {path}")
    for seg in scan_log_dir(path):
        print(json.dumps(seg.to_json()))
    return 0


def cmd_offsets(args: argparse.Namespace) -> int:
    import json

    from streaming.offsets_codec import DecodeError, decode_record

    try:
        key = bytes.fromhex(args.key)
        value = None if args.value is None else bytes.fromhex(args.value)
        print(json.dumps(decode_record(key, value)))
    except ValueError as exc:  # bad hex, or DecodeError
        kind = "cannot decode" if isinstance(exc, DecodeError) else "bad hex"
        raise UsageError(f"{kind}: {exc}") from None
    return 0


COMMANDS = {
    "run": cmd_run,
    "status": cmd_status,
    "config": cmd_config,
    "demo": cmd_demo,
    "agent": cmd_agent,
    "segments": cmd_segments,
    "offsets": cmd_offsets,
}


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        return COMMANDS[args.command](args)
    except UsageError as exc:
        print(f"compactd: error: {exc}", file=sys.stderr)
        return 2
    except (ConfigError, ValidationError, FileNotFoundError) as exc:
        first = str(exc).strip().splitlines()
        print(f"compactd: error: {' '.join(first[:3])}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        print(f"compactd: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
