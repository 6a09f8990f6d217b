"""Attempt statuses (docs/architecture.md §3). Every execution ends in exactly one record with one
of these, so ``count(records) == scheduled + retries`` always holds."""

OK = "ok"  # the agent said done/fail, or the step limit was reached; graded
TRUNCATED = "truncated"  # rollout_timeout passed: stopped stepping, graded
CANCELLED = "cancelled"  # its group closed while it ran; stopped at its next step
SKIPPED = "skipped"  # its group was full before it started
SURPLUS = "surplus"  # finished (graded) after its group had closed
RETRIED = "retried"  # a desktop failure; a new execution of the same logical attempt follows
ERROR = "error"  # error.kind "policy" (model call failed after retries) or "env" (desktop, no retries left)

STATUSES = (OK, TRUNCATED, CANCELLED, SKIPPED, SURPLUS, RETRIED, ERROR)
FINAL_FOR_TRAINING = frozenset({OK, TRUNCATED})
