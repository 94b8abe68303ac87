"""The README's first command: ./scripts/demo runs every section to ok or an explicit skip. The suite runs
`scripts/demo --quick SECTION`: the same commands on the smaller sizes that --quick gives (fewer clients,
rounds, steps and operations; each section's header says which), so the default sizes are not run here."""
from __future__ import annotations

import os
import re
import subprocess

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow  # starts servers or subprocesses
SECTIONS = sorted(p.stem for p in (REPO / "scripts" / "demo.d").glob("*.sh"))


@pytest.mark.parametrize("section", SECTIONS)
def test_each_demo_section_runs_to_ok_or_explicit_skip(tmp_path, section, proc_manager):
    """One section per test, so each stays under the global timeout and sections run in parallel
    (tests/xdist_plan.py spreads them over the workers). Past the timeout the section's whole process
    group is stopped, not only the runner."""
    proc = proc_manager.start([str(REPO / "scripts" / "demo"), "--quick", section], cwd=REPO,
                              env={"DEMO_DIR": str(tmp_path)}, text=True)
    stdout, stderr = proc.communicate(timeout=280)
    r = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    summary = r.stdout.rsplit("\n", 1)[0].splitlines()
    lines = {line.split(":", 1)[0]: line for line in summary if re.match(r"^\d\d-[\w-]+: ", line)}
    assert sorted(lines) == [section], r.stdout[-3000:] + r.stderr[-3000:]
    bad = [line for line in lines.values() if not re.match(r"^[\w-]+: (ok \(|skipped \(needs )", line)]
    assert r.returncode == 0 and not bad, "\n".join(bad) + "\n" + r.stderr[-5000:]


def test_an_unknown_section_is_refused_naming_the_sections():
    r = subprocess.run([str(REPO / "scripts" / "demo"), "99-nope"], cwd=REPO, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "no demo section '99-nope'" in r.stderr and SECTIONS[0] in r.stderr


def test_a_failed_command_fails_its_section(tmp_path):
    """The runner reports FAILED for a section whose command fails mid-way, and a skip as a skip."""
    demo_d = tmp_path / "scripts" / "demo.d"
    demo_d.mkdir(parents=True)
    (tmp_path / "scripts" / "demo").write_text((REPO / "scripts" / "demo").read_text())
    (tmp_path / "scripts" / "setup").write_text("#!/usr/bin/env bash\nexit 0\n")
    for name in ("demo", "setup"):
        (tmp_path / "scripts" / name).chmod(0o755)
    (demo_d / "10-broken.sh").write_text("false | cat\necho after\n")
    (demo_d / "20-skips.sh").write_text('echo "skipped (needs redis-cli: apt-get install redis-tools)"\nexit 77\n')
    (demo_d / "30-fine.sh").write_text("echo fine\n")
    r = subprocess.run([str(tmp_path / "scripts" / "demo")], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "DEMO_DIR": str(tmp_path / "work")}, timeout=60)
    assert r.returncode == 1
    assert "10-broken: FAILED with exit 1" in r.stdout
    assert "20-skips: skipped (needs redis-cli: apt-get install redis-tools)" in r.stdout
    assert "30-fine: ok (" in r.stdout
