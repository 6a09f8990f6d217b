"""Dagster assets of the code location (all partitioned by ``policy_version``)."""

from .collection import COLLECTION_POOL, rollout_batch
from .config import CollectConfig
from .jobs import collect_job
from .partitions import POLICY_VERSION, policy_versions
from .tables import profile_summary, rollouts, training_samples

ASSETS = [rollout_batch, rollouts, training_samples, profile_summary]

__all__ = [
    "ASSETS",
    "COLLECTION_POOL",
    "POLICY_VERSION",
    "CollectConfig",
    "collect_job",
    "policy_versions",
    "profile_summary",
    "rollout_batch",
    "rollouts",
    "training_samples",
]
