"""One error hierarchy for every tool, so a CLI turns any of them into one line and an exit code.

    exit 0  success
    exit 1  runtime failure: an unreachable server, a failed check, corrupt data  (RuntimeFailure)
    exit 2  usage error: a bad flag or value, a bad config or job file            (UsageError)

Libraries raise these too; `mlsyskit.core.cli.run_app` prints `error: <message>` on stderr.
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class UserError(Exception):
    """An error meant for the person at the terminal: one line, no traceback."""

    exit_code = EXIT_FAILURE


class RuntimeFailure(UserError):
    """The request was valid but could not be carried out (unreachable, failed check, corrupt data)."""

    exit_code = EXIT_FAILURE


class UsageError(UserError):
    """The request itself is wrong: a bad flag, value, config or job file."""

    exit_code = EXIT_USAGE
