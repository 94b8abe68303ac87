from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mlsyskit.core.config import ConfigError, format_size, load_config, parse_size, require


@dataclass(frozen=True)
class Inner:
    rate: float = 0.5
    names: tuple[str, ...] = ("a",)


@dataclass(frozen=True)
class Outer:
    steps: int = 10
    verbose: bool = False
    out: Path | None = None
    inner: Inner = field(default_factory=Inner)

    def __post_init__(self):
        require(self.steps > 0, f"steps must be positive, got {self.steps}")


def write(tmp_path, text):
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_defaults_file_and_overrides_layer(tmp_path):
    p = write(tmp_path, 'steps = 5\nout = "x"\n[inner]\nrate = 2\nnames = ["p", "q"]\n')
    cfg = load_config(Outer, p, overrides={"steps": 7, "verbose": None, "inner.rate": 3.5})
    assert cfg.steps == 7  # flag over file
    assert cfg.verbose is False  # None override leaves the default
    assert cfg.out == Path("x")
    assert cfg.inner == Inner(rate=3.5, names=("p", "q"))
    assert load_config(Outer) == Outer()


def test_unknown_key_names_key_and_valid_ones(tmp_path):
    p = write(tmp_path, "step = 5\n")
    with pytest.raises(ConfigError) as e:
        load_config(Outer, p)
    assert "'step'" in str(e.value) and "steps" in str(e.value) and "inner" in str(e.value)


def test_unknown_nested_key_and_bad_types(tmp_path):
    with pytest.raises(ConfigError, match="inner.speed"):
        load_config(Outer, write(tmp_path, "[inner]\nspeed = 1\n"))
    with pytest.raises(ConfigError, match="expected an integer"):
        load_config(Outer, write(tmp_path, 'steps = "many"\n'))
    with pytest.raises(ConfigError, match="expected true/false"):
        load_config(Outer, overrides={"verbose": 3})


def test_validation_in_post_init_and_frozen():
    with pytest.raises(ConfigError, match="steps must be positive"):
        load_config(Outer, overrides={"steps": 0})
    cfg = Outer()
    with pytest.raises(AttributeError):
        cfg.steps = 3  # type: ignore[misc]


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(Outer, tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(Outer, write(tmp_path, "steps = = 3"))


def test_section(tmp_path):
    p = write(tmp_path, "[train]\nsteps = 3\n[other]\nx = 1\n")
    assert load_config(Outer, p, section="train").steps == 3


def test_sizes():
    assert parse_size("2GiB") == 2 * 1024**3
    assert parse_size("512MB") == 512 * 1000**2
    assert parse_size("1.5KiB") == 1536
    assert parse_size(4096) == 4096
    with pytest.raises(ConfigError, match="cannot parse size"):
        parse_size("lots")
    assert format_size(3 * 1024**2) == "3.00 MiB"


@dataclass(frozen=True)
class Typed:
    pair: tuple[int, str] = (1, "a")
    counts: dict[str, int] = field(default_factory=dict)
    rate: float = 1.0
    inner: Inner | None = None


def test_heterogeneous_tuple_dict_values_and_finite_floats():
    assert load_config(Typed, overrides={"pair": [3, "b"]}).pair == (3, "b")
    with pytest.raises(ConfigError, match="pair"):
        load_config(Typed, overrides={"pair": ["x", "b"]})
    assert load_config(Typed, overrides={"counts": {"a": 2}}).counts == {"a": 2}
    with pytest.raises(ConfigError, match=r"counts\.a: expected an integer"):
        load_config(Typed, overrides={"counts": {"a": "two"}})
    for bad in ("nan", "inf", float("nan"), float("-inf")):
        with pytest.raises(ConfigError, match="finite"):
            load_config(Typed, overrides={"rate": bad})


def test_optional_nested_dataclass_checks_unknown_keys():
    assert load_config(Typed, overrides={"inner": {"rate": 2}}).inner == Inner(rate=2.0)
    with pytest.raises(ConfigError, match="inner.speed"):
        load_config(Typed, overrides={"inner": {"speed": 2}})


def test_config_error_is_a_usage_error():
    from mlsyskit.core.errors import UsageError

    with pytest.raises(UsageError) as e:
        load_config(Outer, overrides={"steps": 0})
    assert e.value.exit_code == 2
