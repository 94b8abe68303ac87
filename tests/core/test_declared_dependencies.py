"""Every third-party package imported at run time under core/ and tools/ is declared for the part
that imports it (pyproject: base dependencies, or the tool's extra), so `pip install mlsyskit[kv]`
gives bespokv everything it imports and nothing of torch."""
from __future__ import annotations

import ast
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]

# which extra a source file belongs to; core modules used by one or two tools only belong to them
PARTS = {
    "tools/offload": ["offload"], "tools/fl": ["fl"], "tools/sched": ["sched"], "tools/kv": ["kv"],
    "core/rpc.py": ["fl", "sched"], "core/rpc_base.py": ["fl", "sched"], "core/rpc_client.py": ["fl", "sched"],
    "core/rpc_codec.py": ["fl", "sched"], "core/rpc_tls.py": ["fl", "sched"],
}
# accelerator packages (the gpu extra) are probed at run time wherever they help
PROBED_EXTRAS = ("gpu",)
# import names of packages that may not be installed here (the gpu extra on a CPU machine)
NOT_INSTALLED = {"cupy": ["cupy-cuda12x"], "pynvml": ["nvidia-ml-py"]}
# example jobs that marble runs are user programs, not the tool: they say what they need themselves
NOT_TOOL_CODE = ("tools/sched/examples/",)


def _declared() -> dict[str, set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    parts = {"base": {Requirement(r).name.lower() for r in project["dependencies"]}}
    for extra, reqs in project["optional-dependencies"].items():
        parts[extra] = {Requirement(r).name.lower() for r in reqs if not r.startswith("mlsyskit")}
    return parts


def _part_of(rel: str) -> list[str]:
    for prefix, extras in PARTS.items():
        if rel == prefix or rel.startswith(prefix + "/"):
            return extras
    return ["base"]


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(top-level module, optional) for every import; optional = guarded by except ImportError."""
    tree = ast.parse(path.read_text(), str(path))
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers):
            for inner in node.body:
                guarded.update(id(n) for n in ast.walk(inner))
    lines = path.read_text().splitlines()
    found = []
    for node in ast.walk(tree):
        if "# caller-provided" in lines[node.lineno - 1] if hasattr(node, "lineno") else False:
            continue  # an import reached only with an object of that package in hand
        if isinstance(node, ast.Import):
            found += [(a.name.split(".")[0], id(node) in guarded) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module.split(".")[0], id(node) in guarded))
    return found


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    names = []
    for t in ([handler.type] if not isinstance(handler.type, ast.Tuple) else handler.type.elts):
        if isinstance(t, ast.Name):
            names.append(t.id)
    return bool({"ImportError", "ModuleNotFoundError"} & set(names))


def test_every_runtime_import_is_declared_for_its_part():
    declared = _declared()
    dists = {**NOT_INSTALLED, **{k: [d.lower() for d in v] for k, v in packages_distributions().items()}}
    everything = set().union(*declared.values())
    probed = set().union(*(declared[x] for x in PROBED_EXTRAS))
    problems = []
    for path in sorted([*ROOT.glob("core/**/*.py"), *ROOT.glob("tools/**/*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(NOT_TOOL_CODE):
            continue
        for module, optional in _imports(path):
            if module in sys.stdlib_module_names or module in ("mlsyskit", "__future__"):
                continue
            owners = dists.get(module)
            if not owners:
                problems.append(f"{rel}: imports {module!r}, which no installed distribution provides")
                continue
            if set(owners) & probed:
                continue
            if optional:
                if not set(owners) & everything:
                    problems.append(f"{rel}: optional import {module!r} ({owners[0]}) is in no extra")
                continue
            for part in _part_of(rel):
                allowed = declared["base"] | declared[part]
                if not set(owners) & allowed:
                    problems.append(f"{rel}: imports {module!r} ({owners[0]}), not declared for '{part}'")
    assert not problems, "\n".join(problems)


def test_kv_extra_does_not_pull_torch():
    declared = _declared()
    assert "torch" not in declared["base"] | declared["kv"]
    assert "torch" not in declared["sched"]


@pytest.mark.parametrize("tool", ["tencache", "fl-server", "fl-client", "marble", "bespokv"])
def test_missing_extra_is_one_line(tool, monkeypatch, capsys):
    """A tool started without its extra names the extra to install (exit 1, no traceback)."""
    from mlsyskit.core import entry

    def missing(name):
        raise ModuleNotFoundError("No module named 'somepkg'", name="somepkg")

    monkeypatch.setattr(entry.importlib, "import_module", missing)
    with pytest.raises(SystemExit) as e:
        entry.run(tool)
    assert e.value.code == 1
    message = capsys.readouterr().err.strip()
    assert "\n" not in message and f"mlsyskit[{entry.TOOLS[tool][0]}]" in message and "somepkg" in message
