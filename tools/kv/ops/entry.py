"""The entry of the processes a cluster runs: `python -m mlsyskit.tools.kv.ops.entry node ID --data-dir D`,
`... proxy --data-dir D` and `... supervise --data-dir D --foreground` (record.process_argv and the
checker start them with launcher.ENTRY).

They do what `bespokv node`, `bespokv proxy` and `bespokv supervise --foreground` do (those stay
for people), without importing the command line's typer app and client commands: `up`, the
supervisor and the checker start dozens of these, and each start paid for the whole CLI. Errors
are reported as the CLI reports them: one `error: ...` line and exit 2 (usage) or 1 (runtime).
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from mlsyskit.core.errors import UserError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mlsyskit.tools.kv.ops.entry")
    commands = parser.add_subparsers(dest="command", required=True)
    node = commands.add_parser("node")
    node.add_argument("node_id")
    for command in (node, commands.add_parser("proxy"), commands.add_parser("supervise")):
        command.add_argument("--data-dir", type=Path, default=Path(".bespokv"))
    commands.choices["supervise"].add_argument("--foreground", action="store_true", required=True)
    return parser


def run(argv: Sequence[str]) -> None:
    args = _parser().parse_args(list(argv))
    if args.command == "supervise":
        from mlsyskit.tools.kv.ops import supervisor

        supervisor.serve(args.data_dir)
        return
    from mlsyskit.tools.kv.ops.nodeproc import serve_node

    serve_node(args.data_dir, args.node_id if args.command == "node" else None)


def main() -> None:
    try:
        run(sys.argv[1:])
    except UserError as e:
        from mlsyskit.core.console import error_line  # rich: only when there is an error to print

        error_line(str(e))
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
