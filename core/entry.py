"""Console-script entry points: start a tool, or say in one line which extra it needs.

`pip install mlsyskit[kv]` installs bespokv's packages only; starting `tencache` there must say
"install the offload extra", not print an ImportError traceback. The check costs nothing when
the packages are present: the tool's module is imported, and only a ModuleNotFoundError for a
third-party package is translated.
"""
from __future__ import annotations

import importlib
import sys

# console script -> (extra, module with main())
TOOLS = {
    "tencache": ("offload", "mlsyskit.tools.offload.cli"),
    "fl-server": ("fl", "mlsyskit.tools.fl.server_cli"),
    "fl-client": ("fl", "mlsyskit.tools.fl.client_cli"),
    "marble": ("sched", "mlsyskit.tools.sched.cli"),
    "bespokv": ("kv", "mlsyskit.tools.kv.cli"),
}


def missing_extra_message(tool: str, missing_module: str) -> str:
    extra = TOOLS[tool][0]
    return (f"{tool} needs the '{extra}' extra (Python package '{missing_module}' is not installed): "
            f"pip install 'mlsyskit[{extra}]'")


def run(tool: str) -> None:
    _, module_name = TOOLS[tool]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        top = (e.name or "").split(".")[0]
        if not top or top == "mlsyskit":
            raise
        sys.stderr.write(f"error: {missing_extra_message(tool, top)}\n")
        sys.exit(1)
    module.main()


def tencache() -> None:
    run("tencache")


def fl_server() -> None:
    run("fl-server")


def fl_client() -> None:
    run("fl-client")


def marble() -> None:
    run("marble")


def bespokv() -> None:
    run("bespokv")
