"""Record operations of a task's proofs: the regression test that fails on the base and passes on the head
(DESIGN.md "The proof"), one row per proof run, bound to the head like a check."""

from __future__ import annotations

import json

from agent.ledger import Ledger, now

LISTS = ("test_files", "flipped", "passed_on_base", "skipped", "removed")


def record_proof(ledger: Ledger, task_id: int, round: int, *, head: str, base: str | None, mode: str,
                 verdict: str, reproduces: bool | None, reproduces_why: str, command: str, narrowed: bool, lists: dict[str, list[str]],
                 base_exit: int | None, base_status: str, base_tail: str, duration_s: float,
                 claim_token: str | None) -> int:
    """A proof bound to ``head`` (what ``local_check_pass`` needs besides a passing check: never a rejected one)."""
    from agent.ledger.leases import claimed_tx

    with claimed_tx(ledger, task_id, claim_token) as c:
        row = {"task_id": task_id, "round": round, "head_sha": head, "base_sha": base, "mode": mode,
               "verdict": verdict, "reproduces": None if reproduces is None else int(reproduces),
               "reproduces_why": reproduces_why, "command": command, "narrowed": int(narrowed), "base_exit": base_exit, "base_status": base_status,
               "base_tail": base_tail, "duration_s": duration_s, "created_at": now()}
        row.update({k: json.dumps(list(lists.get(k) or [])) for k in LISTS})
        pid = ledger.insert(c, "proofs", row)
        ledger.event(c, "proof.recorded", "script", {"verdict": verdict, "head": head, "reproduces": reproduces,
                                                      "flipped": len(lists.get("flipped") or [])}, task_id=task_id)
        return pid


def _row(r: dict | None) -> dict | None:
    if r is None:
        return None
    r = dict(r)
    for k in LISTS:
        r[k] = json.loads(r.get(k) or "[]")
    if r.get("reproduces") is not None:
        r["reproduces"] = bool(r["reproduces"])
    return r


def proof_for_head(ledger: Ledger, task_id: int, head: str | None) -> dict | None:
    """The newest proof of ``head``, its lists decoded; None when none was recorded."""
    return _row(ledger.one("SELECT * FROM proofs WHERE task_id = ? AND head_sha = ? ORDER BY id DESC LIMIT 1",
                           (task_id, head)))


def task_proofs(ledger: Ledger, task_id: int) -> list[dict]:
    return [_row(r) for r in ledger.all("SELECT * FROM proofs WHERE task_id = ? ORDER BY id", (task_id,))]


def proof_states(ledger: Ledger) -> dict[int, str]:
    """Each task's proof word for its current head: proven, unproven, rejected, off (absent: not run yet)."""
    rows = ledger.all("SELECT p.task_id, p.verdict FROM proofs p JOIN tasks t ON t.id = p.task_id "
                      "AND t.head_sha = p.head_sha ORDER BY p.id")
    return {r["task_id"]: r["verdict"] for r in rows}


def summary(p) -> str:
    """One line for a spec, `task show` and the status: proven / unproven and why."""
    if p is None:
        return "not checked yet"
    d = p if isinstance(p, dict) else p.__dict__
    verdict = d.get("verdict")
    if verdict == "proven":
        n = len(d.get("flipped") or [])
        what = "reproduces the error" if d.get("reproduces") else "regression test only"
        fails = "test fails" if n == 1 else "tests fail"
        return f"proven: {n} {fails} on the base and pass{'es' if n == 1 else ''} on the head ({what})"
    if verdict == "off":
        return "unproven: proof is off for this repository"
    if verdict == "unproven":
        return "unproven: no test fails on the base (the repository says proof: optional)"
    return "rejected: no test fails on the base"
