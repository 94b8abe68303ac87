"""fl-server command line."""
from mlsyskit.core.cli import make_app, run_app

app = make_app(
    "fl-server",
    "Federated learning server (after TIFF, CLOUD'22): selects clients each round, aggregates their "
    "updates and runs a token economy that pays providers of good data and starves bad data.",
)


def main() -> None:
    run_app(app)
