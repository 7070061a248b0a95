"""Task operations: create, read, close/reopen steps through the guard, change state, new rounds, reset.

They are the record operations of the tasks aggregate and live with the ledger (``agent.ledger.tasks``: only
``agent/ledger`` speaks SQL); this module names the ones the commands, the fixer and the scans call. Errors
(``resolve_error`` and the error state machine) are in ``agent.ledger.errors``.
"""

from __future__ import annotations

from agent.ledger.tasks import (HUMAN_STEP_PENDING, ClaimLost, LeaseLost, Refused, check_claim, claimed_tx,
                                config_blocked_tasks, create_task, get_task, lift_config_block, iter_tasks, list_tasks,
                                note_wait, open_task_needs, reset_task, set_step, snapshot, start_feedback_round,
                                start_next_round, task_budget, task_detail, transition, transition_in)

__all__ = ["HUMAN_STEP_PENDING", "ClaimLost", "LeaseLost", "Refused", "check_claim", "claimed_tx", "config_blocked_tasks",
           "create_task", "get_task", "lift_config_block", "iter_tasks", "list_tasks", "note_wait", "open_task_needs",
           "reset_task", "set_step", "snapshot", "start_feedback_round", "start_next_round",
           "task_budget", "task_detail", "transition", "transition_in"]
