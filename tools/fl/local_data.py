"""A party's own data: `fl-client run --data SPEC` and `fl-server run --validation/--test SPEC`.

SPEC is one of
  * a file: `.npz` with arrays `x` (samples x features; more dimensions are flattened) and `y`
    (integer labels 0..C-1), or `.csv` with one sample per row, the features first and the integer
    label last (a first row that is not numbers is taken as a header);
  * a folder with `train.npz` or `train.csv` (the server's may name it `validation`), and optionally
    `test.npz` or `test.csv` (the party's own held-out split; without it a client holds out a seeded
    20% of its samples) and `task.json` ({"num_classes": C}, written by `fl-server partition`);
  * `package.module:loader`: loader() is called with no arguments, in this process only, and returns
    (x, y) or (x_train, y_train, x_test, y_test): this party's own arrays.
`fl-server partition` writes such folders. Nothing here is ever sent to another party: a client
tells the server only how many training samples it has.

Errors: a SPEC that cannot be used (no such file, bad format, wrong shapes) is a DataSpecError (a
usage error, exit 2); an exception raised inside a loader is a UserCodeError (exit 1), both one line
naming the SPEC.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mlsyskit.tools.fl.plugins import PluginError, UserCodeError, call_user, load_object
from mlsyskit.tools.fl.scaling import standardizer
from mlsyskit.tools.fl.task import ClientData, ServerData

HELD_OUT = 0.2  # of a client's samples, when its SPEC has no test split


class DataSpecError(PluginError):
    """A --data/--validation/--test SPEC that cannot be used."""


def _read_csv(path: Path, what: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        with path.open() as f:
            first = f.readline()
        skip = 0 if _numeric(first) else 1
        table = np.loadtxt(path, delimiter=",", skiprows=skip, dtype=np.float64, ndmin=2)
    except (OSError, ValueError) as e:
        raise DataSpecError(f"{what} {path}: cannot read it as CSV ({e})") from None
    if table.shape[1] < 2:
        raise DataSpecError(f"{what} {path}: a CSV needs feature columns and a last label column")
    return table[:, :-1], table[:, -1]


def _numeric(line: str) -> bool:
    try:
        [float(v) for v in line.strip().split(",")]
    except ValueError:
        return False
    return True


def _read_npz(path: Path, what: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as f:
            if "x" not in f or "y" not in f:
                raise DataSpecError(f"{what} {path}: an .npz needs arrays named x and y, it has {sorted(f.files)}")
            return f["x"], f["y"]
    except (OSError, ValueError) as e:
        raise DataSpecError(f"{what} {path}: cannot read it as .npz ({e})") from None


def _read_file(path: Path, what: str) -> tuple[np.ndarray, np.ndarray]:
    if path.suffix == ".npz":
        return _read_npz(path, what)
    if path.suffix == ".csv":
        return _read_csv(path, what)
    raise DataSpecError(f"{what} {path}: a data file must end in .npz or .csv")


def _in_folder(folder: Path, stem: str) -> Path | None:
    found = [folder / f"{stem}{ext}" for ext in (".npz", ".csv") if (folder / f"{stem}{ext}").is_file()]
    return found[0] if found else None


def checked(x: object, y: object, what: str) -> tuple[np.ndarray, np.ndarray]:
    """(x float32 samples x features, y int64 labels >= 0), or a DataSpecError saying what is wrong."""
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim < 2 or y.ndim != 1 or len(x) != len(y):
        raise DataSpecError(f"{what}: x must be (samples, features...) and y (samples,), got x {x.shape} and y {y.shape}")
    x = x.reshape(len(x), -1)
    if not np.issubdtype(x.dtype, np.number) or not np.isfinite(x).all():
        raise DataSpecError(f"{what}: x must be finite numbers")
    if len(y) and (not np.issubdtype(y.dtype, np.number) or (y != np.round(y)).any() or y.min() < 0):
        raise DataSpecError(f"{what}: y must be integer labels 0..C-1")
    return x.astype(np.float32), y.astype(np.int64)


def read_spec(spec: str, what: str) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray] | None]:
    """((x, y), (x_test, y_test) or None) from a file, a folder or a package.module:loader."""
    label = f"{what} {spec!r}"
    path = Path(spec)
    if ":" in spec and not path.exists():
        out = call_user(load_object(spec, what), label)
        if not isinstance(out, tuple) or len(out) not in (2, 4):
            raise DataSpecError(f"{label} must return (x, y) or (x_train, y_train, x_test, y_test), "
                                f"got {type(out).__name__}")
        train = checked(out[0], out[1], label)
        return train, checked(out[2], out[3], f"{label} (test split)") if len(out) == 4 else None
    if path.is_file():
        return checked(*_read_file(path, what), label), None
    if path.is_dir():
        train_file = (what == "--validation" and _in_folder(path, "validation")) or _in_folder(path, "train")
        if train_file is None:
            raise DataSpecError(f"{label}: the folder has no {'validation or ' * (what == '--validation')}train "
                                ".npz or .csv")
        test_file = _in_folder(path, "test")
        train = checked(*_read_file(train_file, what), f"{what} {train_file}")
        return train, None if test_file is None else checked(*_read_file(test_file, what), f"{what} {test_file}")
    raise DataSpecError(f"{label}: no such file or folder (and not a package.module:loader)")


def load_client_data(spec: str, client_id: int, seed: int = 0) -> ClientData:
    """This client's own data; a SPEC without a test split gives a seeded HELD_OUT of it to the test split."""
    (x, y), test = read_spec(spec, "--data")
    if test is None:
        order = np.random.default_rng([seed, client_id]).permutation(len(y))
        n_test = max(1, int(round(len(y) * HELD_OUT))) if len(y) > 1 else 0
        test = (x[order[:n_test]], y[order[:n_test]])
        x, y = x[order[n_test:]], y[order[n_test:]]
    if len(y) == 0:
        raise DataSpecError(f"--data {spec!r} has no training samples")
    return ClientData(client_id, x, y, *test)


def check_fits(data: ClientData, num_features: int, num_classes: int, spec: str) -> None:
    """A client's data must have the job's number of features and labels below its number of classes."""
    if data.x_train.shape[1] != num_features or data.x_test.shape[1] != num_features:
        raise DataSpecError(f"--data {spec!r} has {data.x_train.shape[1]} features per sample; the server's task "
                            f"has {num_features}")
    top = max(int(data.y_train.max(initial=0)), int(data.y_test.max(initial=0)))
    if top >= num_classes:
        raise DataSpecError(f"--data {spec!r} has label {top}; the server's task has classes 0..{num_classes - 1}")


def load_server_data(validation: str, test: str | None = None, num_classes: int | None = None,
                     input_scaling: str = "none") -> ServerData:
    """The server's root/validation set (FLTrust's root dataset) and its test set for reporting (default: a
    folder's test split, else the validation set itself). Classes: `num_classes`, else the largest label + 1.
    `input_scaling` standardize: both sets scaled with the root set's statistics, which the task carries."""
    (x_val, y_val), folder_test = read_spec(validation, "--validation")
    if test is not None:
        (x_test, y_test), _ = read_spec(test, "--test")
    else:
        x_test, y_test = folder_test if folder_test is not None else (x_val, y_val)
    if x_test.shape[1] != x_val.shape[1]:
        raise DataSpecError(f"--test has {x_test.shape[1]} features per sample, --validation {x_val.shape[1]}")
    if len(y_val) == 0:
        raise DataSpecError(f"--validation {validation!r} has no samples")
    top = int(max(y_val.max(), y_test.max(initial=0))) + 1
    task = Path(validation) / "task.json"
    if num_classes is None and task.is_file():
        try:
            num_classes = int(json.loads(task.read_text())["num_classes"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DataSpecError(f"--validation {validation!r}: cannot read {task} ({e})") from None
    classes = num_classes or top
    if classes < max(top, 2):
        raise DataSpecError(f"--classes {classes} is fewer than the labels in --validation/--test (0..{top - 1})")
    scaling = standardizer(x_val, input_scaling)
    if scaling is not None:
        x_val, x_test = scaling.apply(x_val), scaling.apply(x_test)
    return ServerData(x_val.shape[1], classes, x_val, y_val, x_test, y_test, input_scaling=scaling)


__all__ = ["DataSpecError", "UserCodeError", "check_fits", "load_client_data", "load_server_data", "read_spec"]
