"""tencache command line."""
from mlsyskit.core.cli import make_app, run_app

app = make_app(
    "tencache",
    "Train models larger than device memory (after 10Cache, SoCC'25): profile the execution order of "
    "parameter tensors, then cache and prefetch parameters and optimizer states across GPU, CPU and NVMe "
    "with size-class buffer pools that are reused, never reallocated.",
)


def main() -> None:
    run_app(app)
