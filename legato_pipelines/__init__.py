"""legato-pipelines: rollout collection for computer-use RL.

Per policy version it drives desktops through screenshot -> policy call -> action -> wait
until ready, grades every attempt, and writes trajectories a trainer uses directly (token ids,
logprobs, rewards, GRPO group advantages, policy version).

Public API::

    collect(tasks, policy, out, **knobs) -> summary      # one batch into a run directory
                                                         # (knobs: CollectSettings' fields,
                                                         # or settings=CollectSettings(...))
    export_steps(run_dir) -> pyarrow.Table               # training samples with advantages
    load_request(run_dir, rollout_id, step) -> messages  # the exact prompt of a step
    profile(run_dir) -> summary                          # recompute the profile

``collect(..., load=LoadSpec(mode="lora", checkpoint=FOLDER))`` loads the version's checkpoint
into the model server before any desktop starts (``legato_pipelines.policy.loading``).
"""

from typing import TYPE_CHECKING

from .errors import (
    ConfigError,
    DesktopError,
    ImageLimitError,
    LegatoError,
    LoadError,
    PolicyConfigError,
    PolicyError,
    PolicyTimeout,
    ResumeError,
    TaskListError,
)
from .lazy import lazy_getattr

#: The public names that live in submodules, imported on first use (PEP 562): a process that
#: needs one part (a desktop server, an osworld worker's helpers) does not import the engine,
#: httpx, pyarrow's users and the task models (~0.5 s of CPU per desktop server start).
_LAZY = {
    "DesktopConfig": ".desktops.base",
    "PolicyConfig": ".policy.config",
    "LoadSpec": ".policy.loading",
    "Record": ".record",
    "collect": ".rollout.engine",
    "collect_async": ".rollout.engine",
    "profile": ".rollout.profile",
    "CollectSettings": ".rollout.settings",
    "export_steps": ".store.export",
    "group_advantages": ".store.export",
    "load_request": ".store.rundir",
    "read_records": ".store.rundir",
    "Task": ".tasks",
    "TaskSet": ".tasks",
    "load_tasks": ".tasks",
}

if TYPE_CHECKING:
    from .desktops.base import DesktopConfig
    from .policy.config import PolicyConfig
    from .policy.loading import LoadSpec
    from .record import Record
    from .rollout.engine import collect, collect_async
    from .rollout.profile import profile
    from .rollout.settings import CollectSettings
    from .store.export import export_steps, group_advantages
    from .store.rundir import load_request, read_records
    from .tasks import Task, TaskSet, load_tasks


__getattr__ = lazy_getattr(__name__, _LAZY, globals())


__all__ = [
    "collect",
    "collect_async",
    "CollectSettings",
    "Record",
    "export_steps",
    "group_advantages",
    "load_request",
    "read_records",
    "profile",
    "load_tasks",
    "Task",
    "TaskSet",
    "PolicyConfig",
    "LoadSpec",
    "DesktopConfig",
    "LegatoError",
    "ConfigError",
    "TaskListError",
    "ResumeError",
    "PolicyError",
    "PolicyTimeout",
    "PolicyConfigError",
    "ImageLimitError",
    "LoadError",
    "DesktopError",
]
