"""bespokv command line."""
from mlsyskit.core.cli import make_app, run_app

app = make_app(
    "bespokv",
    "Scale-out KV store framework (after bespoKV, SC'18): turns a single-server KV store (a datalet) into "
    "a sharded, replicated store by picking controlets for topology (master-slave / active-active) and "
    "consistency (strong / eventual), spoken to over the Redis protocol.",
)


def main() -> None:
    run_app(app)
