"""FL job configuration: frozen dataclasses, loadable from TOML, validated on construction.

One `JobConfig` describes a whole federated job, the same for `fl-server run` and
`fl-server simulate`. In `simulate` (and `partition`) the data part (`DataSpec`) says how one
dataset is split among the clients; in `run` every client holds its own data (dataset `own`) and
the server tells clients only the task (input features, classes) and the training recipe.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from mlsyskit.core.config import require
from mlsyskit.tools.fl.scaling import SCALINGS

DATASETS = ("digits", "mnist1d", "synthetic", "breast-cancer")
OWN_DATA = "own"  # `fl-server run`: every client holds its own data (fl-client run --data); nothing is partitioned
PARTITIONS = ("iid", "dirichlet", "shards")
ATTACKS = ("none", "label-flip", "noisy-labels", "random-update", "free-rider", "quality-liar", "sign-flip", "scaled")


@dataclass(frozen=True)
class DataSpec:
    dataset: str = "digits"
    num_clients: int = 10
    partition: str = "dirichlet"
    alpha: float = 0.5  # Dirichlet concentration of label skew
    shards_per_client: int = 2
    synthetic_alpha: float = 1.0  # LEAF synthetic(alpha, beta): model and feature heterogeneity
    synthetic_beta: float = 1.0
    test_fraction: float = 0.2  # each client's own test split (and the global held-out split)
    seed: int = 0
    # your own data (a loader, --validation/--data files): standardize | none, with the server's root-set
    # statistics (scaling.py); the built-in datasets come prepared and are left as they are
    input_scaling: str = "standardize"

    def __post_init__(self) -> None:
        require(self.dataset in DATASETS or self.dataset == OWN_DATA or ":" in self.dataset,
                f"dataset must be one of {', '.join(DATASETS)} or package.module:loader, got {self.dataset!r}")
        require(self.partition in PARTITIONS, f"partition must be one of {', '.join(PARTITIONS)}")
        require(self.num_clients >= 1, "num_clients must be at least 1")
        require(self.alpha > 0, "alpha must be positive")
        require(self.shards_per_client >= 1, "shards_per_client must be at least 1")
        require(0 < self.test_fraction < 1, "test_fraction must be in (0, 1)")
        require(self.input_scaling in SCALINGS, f"input_scaling must be one of {', '.join(SCALINGS)}")


@dataclass(frozen=True)
class TrainSpec:
    """What a selected client does with the global model (sent with every round)."""

    epochs: int = 5
    batch_size: int = 16
    lr: float = 0.05
    momentum: float = 0.9
    hidden: int = 64
    model: str = ""  # "package.module:factory" -> torch nn.Module(num_features, num_classes); "" = the MLP
    local_only_epochs: int = 20  # the consumer's local-only baseline for the utility ratio

    def __post_init__(self) -> None:
        require(self.epochs >= 1 and self.batch_size >= 1, "epochs and batch_size must be at least 1")
        require(self.lr > 0, "lr must be positive")
        require(self.hidden >= 1, "hidden must be at least 1")


@dataclass(frozen=True)
class SelectionConfig:
    """Epsilon-greedy on quality history (TIFF); `random` ignores everything but k."""

    epsilon: float = 0.3  # initial exploration probability per slot
    epsilon_decay: float = 0.95  # multiplied in every round
    epsilon_min: float = 0.05
    history: str = "ema"  # ema | window
    ema_beta: float = 0.5  # weight of the newest observation
    window: int = 5
    optimistic_quality: float = 1.0  # what an unseen client is assumed to score

    def __post_init__(self) -> None:
        require(0 <= self.epsilon_min <= self.epsilon <= 1, "need 0 <= epsilon_min <= epsilon <= 1")
        require(0 < self.epsilon_decay <= 1, "epsilon_decay must be in (0, 1]")
        require(self.history in ("ema", "window"), "history must be ema or window")
        require(0 < self.ema_beta <= 1 and self.window >= 1, "ema_beta in (0, 1] and window >= 1")


@dataclass(frozen=True)
class EconomyConfig:
    """The token economy (TIFF); the default strategy keeps prices and fee but pays equally."""

    endowment: float = 1000.0  # tokens minted to every client when it first registers
    price: float = 1.0  # paid into escrow by every consumer each round
    infra_fee: float = 0.1  # fraction of escrow kept by the infrastructure
    quality_exponent: float = 2.0  # provider weight = samples * quality ** exponent
    quality_floor: float = 0.25  # x round median quality: providers below it are neither aggregated nor paid
    reimburse_every: int = 0  # rounds between consumer reimbursements; 0 = once, at the end of the job

    def __post_init__(self) -> None:
        require(self.endowment >= 0 and self.price >= 0, "endowment and price must be non-negative")
        require(0 <= self.infra_fee < 1, "infra_fee must be in [0, 1)")
        require(self.quality_exponent >= 0, "quality_exponent must be non-negative")
        require(0 <= self.quality_floor <= 1, "quality_floor must be in [0, 1]")
        require(self.reimburse_every >= 0, "reimburse_every must be >= 0")


@dataclass(frozen=True)
class JobConfig:
    strategy: str = "tiff+fedadam-sfcap"  # strategy.DEFAULT_STRATEGY (a literal: the strategy package imports this module)
    scheduler: str = ""  # "" = the strategy's own selector; else a name in scheduling.SCHEDULERS (random, tifl,
    # oort, fast, rfair, afair, perf, adaptive): it picks who trains and sets each round's deadline
    rounds: int = 10
    per_round: int = 5
    min_clients: int = 2  # connected clients a round needs (as Flower's min_available_clients); the job goes on
    # while at least this many are connected (capped at data.num_clients)
    fill_timeout_s: float = 5.0  # then wait up to this long for per_round connected clients before selecting
    round_timeout_s: float = 30.0  # per-round deadline for updates (virtual seconds in simulation)
    max_update_bytes: int = 16 * 1024 * 1024
    seed: int = 0
    data: DataSpec = field(default_factory=DataSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    economy: EconomyConfig = field(default_factory=EconomyConfig)

    def __post_init__(self) -> None:
        require(self.rounds >= 1, "rounds must be at least 1")
        require(1 <= self.per_round <= self.data.num_clients,
                f"per_round must be in [1, clients={self.data.num_clients}], got {self.per_round}")
        require(self.min_clients >= 1, f"min_clients must be at least 1, got {self.min_clients}")
        require(self.fill_timeout_s >= 0, "fill_timeout_s must be non-negative")
        require(self.round_timeout_s > 0, "round_timeout_s must be positive")
        require(self.max_update_bytes > 0, "max_update_bytes must be positive")
        require(self.scheduler == "" or self.scheduler.replace("-", "").isalnum(),
                f"scheduler must be a scheduler name, got {self.scheduler!r}")

    @property
    def wait_for(self) -> int:
        """Connected clients a round needs."""
        return min(self.min_clients, self.data.num_clients)

    def to_dict(self) -> dict:
        return asdict(self)


def check_address(address: str, option: str) -> str | None:
    """Why `address` is not HOST:PORT (None when it is), so the CLIs can say so before gRPC logs its own."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        return f"{option} must be HOST:PORT with a port in 0..65535, got {address!r}"
    return None


@dataclass(frozen=True)
class ClientConfig:
    """`fl-client run` settings (its --config FILE.toml takes these keys; flags override them)."""

    server: str = "127.0.0.1:7070"
    client_id: int | None = None
    data: str | None = None  # this client's own data: a folder, an .npz/.csv file or package.module:loader
    model: str | None = None  # package.module:factory for the job's model (default: the target the job names)
    attack: str = "none"
    certs: str | None = None  # folder from `fl-server certs`: ca.pem, client-<ID>.pem/.key
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_server_name: str | None = None
    token_file: str | None = None
    reconnect_s: float = 60.0  # give up after this long without any message from a server
    slowdown: str | None = None  # "ROUND:SECONDS": from that round on, each local training takes SECONDS longer

    def __post_init__(self) -> None:
        require(self.client_id is not None, "--client-id is required (or client_id in --config)")
        require(self.data is not None, "--data is required (this client's own data; or data in --config)")
        require(self.client_id is None or self.client_id >= 0, f"--client-id must be >= 0, got {self.client_id}")
        require(self.attack in ATTACKS, f"--attack must be one of {', '.join(ATTACKS)}, got {self.attack!r}")
        require(self.reconnect_s > 0, "--reconnect must be positive")
        require(check_address(self.server, "--server") is None, check_address(self.server, "--server") or "")
        require(self.slowdown is None or parse_slowdown(self.slowdown) is not None,
                f"--slowdown must be ROUND:SECONDS (round >= 1, seconds >= 0), got {self.slowdown!r}")


def parse_slowdown(text: str) -> tuple[int, float] | None:
    """'5:0.5' -> (5, 0.5): from round 5 on, local training takes 0.5 s longer; None if malformed."""
    head, sep, tail = text.partition(":")
    try:
        round_num, seconds = int(head), float(tail)
    except ValueError:
        return None
    ok = sep and round_num >= 1 and 0 <= seconds < float("inf")
    return (round_num, seconds) if ok else None
