"""The Dagster code location: ``dagster dev -w workspace.yaml``, ``dg check defs``,
``dagster asset materialize -m legato_pipelines.definitions``.

Assets (all partitioned by ``policy_version``): ``rollout_batch`` (collection) ->
``rollouts``, ``training_samples``, ``profile_summary`` (the Parquet/DuckDB lake); their
checks; ``collect_job``; ``checkpoint_sensor``; resources configured from the environment
(:mod:`legato_pipelines.resources.defaults`).
"""

from __future__ import annotations

import dagster as dg

from .assets import ASSETS, collect_job
from .resources.defaults import default_resources
from .sensors import checkpoint_sensor

# In-process: the collection is one asyncio process of its own making and the three lake steps
# take about a second each, so a Python start-up per step (the multiprocess executor: 5-10 s
# on a small machine) would dominate a batch's overhead.
defs = dg.Definitions(
    assets=ASSETS,
    jobs=[collect_job],
    sensors=[checkpoint_sensor],
    resources=default_resources(),
    executor=dg.in_process_executor,
)
