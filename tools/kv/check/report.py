"""How a check's verdict is shown: a table (or JSON) on stdout, the reasons on stderr, exit 1 if invalid."""
from __future__ import annotations

from mlsyskit.core.console import emit_json, emit_table, log, make_table
from mlsyskit.core.errors import RuntimeFailure


def _yes_no(value: bool | None, unknown: str = "n/a") -> str:
    return unknown if value is None else "yes" if value else "NO"


def emit(result, as_json: bool) -> None:
    spec = result.spec
    if as_json:
        emit_json(result.as_dict())
    else:
        o = result.outcomes
        kinds = sorted({f["fault"] for f in result.faults})
        rows = [[spec["mode"], spec.get("seed", "-"), f"{o.get('ok', 0)}/{o.get('fail', 0)}/{o.get('info', 0)}",
                 ",".join(kinds) or "-",
                 _yes_no(result.linearizable, "not checked" if not spec["mode"].endswith("-sc") else "unknown"),
                 result.lost_acked_writes, result.phantoms,
                 _yes_no(result.converged, "not observed") if result.converged is not None else "not observed",
                 result.convergence_s, result.max_write_wait_s, result.write_timeouts,
                 getattr(result, "reconfigurations", 0), getattr(result, "async_failover_losses", 0),
                 _yes_no(result.valid)]]
        emit_table(make_table("bespokv check", ["mode", "seed", "ok/fail/info", "faults", "linearizable",
                                                "lost acked", "phantoms", "converged", "converge s",
                                                "max write wait s", "write timeouts", "maps",
                                                "async lost", "valid"], rows))
    for line in result.violations + result.lost:
        log(line)
    if result.error:
        log(f"the run did not finish: {result.error}")
    log(f"history: {result.history}")


def raise_if_invalid(result) -> None:
    if result.valid:
        return
    reasons = []
    if result.error:
        reasons.append(result.error)
    if result.linearizable is False:
        reasons.append("not linearizable")
    elif result.linearizable is None and result.spec["mode"].endswith("-sc") and not result.error:
        reasons.append("linearizability unknown (search budget)")
    if result.lost_acked_writes:
        reasons.append(f"{result.lost_acked_writes} acknowledged writes lost")
    if result.phantoms:
        reasons.append(f"{result.phantoms} phantom values")
    if result.converged is False and not result.error:
        reasons.append("replicas did not converge")
    seed = result.spec.get("seed")
    raise RuntimeFailure(f"check failed: {'; '.join(reasons)}" + (f" (seed {seed})" if seed is not None else ""))
