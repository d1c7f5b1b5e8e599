"""One root exception, a named type for every failure; the CLI maps each to an exit status and one line.

`exit_code` 2 means bad usage or bad input, 1 any other failure (an unreachable dependency, a failed query).
"""

from __future__ import annotations


class CompactdError(Exception):
    """Root of every error compactd raises on purpose."""

    exit_code = 1


class UsageError(CompactdError):
    """A bad flag, argument or command."""

    exit_code = 2


class ConfigError(CompactdError, ValueError):
    """A setting or threshold that cannot be applied; the message names it."""

    exit_code = 2


class InputError(CompactdError, ValueError):
    """Bytes handed to a command by hand (hex, a file) that do not parse."""

    exit_code = 2


class DecodeError(InputError):
    """Bytes that do not parse as the record they claim to be; the message says where."""


class DependencyUnavailable(CompactdError):
    """Kafka or Redis cannot be reached: names the component, the address and the setting to change."""

    def __init__(self, component: str, address: str, setting: str, cause: str) -> None:
        self.component, self.address, self.setting, self.cause = component, address, setting, cause
        super().__init__(f"{component} unreachable at {address} ({cause}); check {setting}")


class ExecutorsUnavailable(CompactdError):
    """The Spark cluster runs no task for compactd, or its executors lack compactd's environment."""


class SourceReadError(CompactdError):
    """A Kafka range could not be read inside a Spark task (Spark retries the task where it can)."""


class DeliveryTimeout(CompactdError):
    """Records written to a Kafka topic were not acknowledged in time (or were refused)."""


class UnsafeDecision(CompactdError):
    """A decision broke a safety invariant; it is dropped and logged, never sent."""


class QueryFailed(CompactdError):
    """The Spark streaming query stopped with an error; the message is its root cause, on one line."""


class ForcedStop(CompactdError):
    """A second SIGTERM/SIGINT while stopping: exit now; the checkpoint replays the batch that was running."""


def forced_by(stop: object) -> ForcedStop | None:
    """The second signal a stop event (the CLI's `StopEvent`) recorded. Raised by a signal handler inside a Py4J call,
    ForcedStop reaches the caller as Py4J's own error ("An error occurred while calling o111.isActive"): whoever
    catches that asks here whether it was the second signal."""
    forced = getattr(stop, "forced", None)
    return forced if isinstance(forced, ForcedStop) else None


class StopTimeout(CompactdError):
    """The running batch did not finish within stop_timeout_ms after a stop was asked for."""


class Rejected(Exception):
    """An input record (an event, a config event) that fails the contract, and goes to the DLQ; `reason` is a short,
    stable code (`compactd.labels`) plus a human message."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
