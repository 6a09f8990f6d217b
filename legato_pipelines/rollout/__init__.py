"""The rollout engine, free of Dagster: scheduling, the step loop, statuses, timeouts."""
