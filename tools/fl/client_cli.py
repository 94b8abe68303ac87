"""fl-client command line."""
from mlsyskit.core.cli import make_app, run_app

app = make_app(
    "fl-client",
    "Federated learning client: registers with an fl-server, trains on its own data partition when "
    "selected and reports its update with measured quality and resource use.",
)


def main() -> None:
    run_app(app)
