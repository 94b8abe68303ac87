"""marble command line."""
from mlsyskit.core.cli import make_app, run_app

app = make_app(
    "marble",
    "Multi-GPU-aware DL job scheduler (after MARBLE, CCGrid'20): gives each job the GPUs per node where "
    "its training is still efficient, packs jobs onto shared nodes and keeps FIFO fairness; includes a "
    "trace-driven cluster simulator.",
)


def main() -> None:
    run_app(app)
