"""``collect_job``: collect one policy version and build its lake partitions, in one run."""

from __future__ import annotations

import dagster as dg

from .collection import rollout_batch
from .tables import profile_summary, rollouts, training_samples

collect_job = dg.define_asset_job(
    "collect_job",
    selection=dg.AssetSelection.assets(rollout_batch, rollouts, training_samples, profile_summary),
    description="Collect a batch for a policy version (partition), then write rollouts, samples and profile to the lake.",
)
