import pytest

from mlsyskit.core.config import ConfigError
from mlsyskit.core.registry import Registry, UnknownNameError


class Alpha:
    name = "alpha"


class Beta:
    pass


def test_register_lookup_and_iteration():
    reg: Registry = Registry("policy")
    reg.add(Alpha)
    reg.register("beta")(Beta)
    assert reg.get("alpha") is Alpha and reg["beta"] is Beta
    assert list(reg) == ["alpha", "beta"] and len(reg) == 2 and "beta" in reg
    assert reg.items() == [("alpha", Alpha), ("beta", Beta)]


def test_duplicates_and_unknown_names_are_refused():
    reg: Registry = Registry("datalet")
    reg.add(Alpha)
    with pytest.raises(ValueError, match="registered twice"):
        reg.add(Alpha)
    with pytest.raises(ValueError, match="needs a name"):
        reg.add(Beta)
    with pytest.raises(UnknownNameError) as e:
        reg.get("alfa")
    assert str(e.value) == "unknown datalet 'alfa'; choose from alpha"
    assert isinstance(e.value, ConfigError) and isinstance(e.value, KeyError)
