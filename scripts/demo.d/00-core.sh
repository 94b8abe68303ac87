# Core: the five commands answer, and the telemetry summary of a tiny seeded simulation.
set -euo pipefail
for cmd in tencache fl-server fl-client marble bespokv; do "$cmd" --version; done
python -m mlsyskit.core.selfcheck
