"""spark-submit's main file for compactd: `compactd run` with the arguments it is given (deploy/submit passes them)."""

from __future__ import annotations

import sys

from compactd.app.cli import main


def compactd_argv(args: list[str]) -> list[str]:
    """`run` and its options; `--log-level X` moves before the subcommand, where the CLI takes it."""
    top: list[str] = []
    if "--log-level" in args:
        at = args.index("--log-level")
        top, args = args[at : at + 2], args[:at] + args[at + 2 :]
    return [*top, "run", *args]


if __name__ == "__main__":
    raise SystemExit(main(compactd_argv(sys.argv[1:])))
