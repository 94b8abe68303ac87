"""Scheduling policies, one per file, behind `Policy`, registered here by their `name`.

The suite's one way to add a plug-in: write the class in its own file, then add it to the tuple
below (plug-in modules never import the registry, so there is no import cycle).

`DEFAULT_POLICY` is the one a user should pick (`marble sim` and `marble serve` default to it):
see docs/marble.md ("Which policy") for the benchmark behind that choice.
"""
from mlsyskit.tools.sched.policies.backfill import Backfill
from mlsyskit.tools.sched.policies.base import POLICIES, Policy, PolicyOptions, create_policy, register
from mlsyskit.tools.sched.policies.fifo import Fifo
from mlsyskit.tools.sched.policies.marble import Marble
from mlsyskit.tools.sched.policies.marble_elastic import MarbleElastic
from mlsyskit.tools.sched.policies.marble_fifo import MarbleFifo
from mlsyskit.tools.sched.policies.marble_goodput import MarbleGoodput
from mlsyskit.tools.sched.policies.marble_las import MarbleLas
from mlsyskit.tools.sched.policies.optimus import Optimus
from mlsyskit.tools.sched.policies.pollux import Pollux
from mlsyskit.tools.sched.policies.tiresias import Tiresias

for _cls in (Fifo, Backfill, Optimus, Tiresias, MarbleGoodput, Marble, MarbleFifo, MarbleElastic, MarbleLas, Pollux):
    register(_cls)

DEFAULT_POLICY = MarbleGoodput.name

__all__ = ["DEFAULT_POLICY", "POLICIES", "Policy", "PolicyOptions", "create_policy", "register"]
