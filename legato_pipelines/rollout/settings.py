"""Collection settings: every knob of one batch, with its default, unit and check, in one place
(docs/architecture.md §3).

Everything else derives from :class:`CollectSettings`: the keyword arguments of
:func:`~legato_pipelines.collect` (mapped onto it), the ``legato collect`` flags (generated
from its fields: ``--max-steps``, ``--ready-signal/--no-ready-signal``...), Dagster's run
config ``CollectConfig`` (built from the same fields), the ``knobs`` of ``run.json`` and the
settings a resumed run must share with the run it continues (:data:`RESUME_SETTINGS`).

The settings that describe the policy server or the desktops themselves (URL, model, backend,
screen size, evaluation timeout...) are not here: they are :class:`PolicyConfig` and
:class:`DesktopConfig`. ``step_timeout``/``retries`` and ``ready_signal``/``fixed_wait``/
``fast_reset`` override those configs' values when they are set.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..desktops.registry import capabilities
from ..errors import ConfigError
from ..policy.config import PolicyConfig

OVERRIDES_POLICY = ("step_timeout", "retries")
"""Settings that, when set, override the :class:`PolicyConfig`'s field of the same name."""
OVERRIDES_DESKTOP = ("ready_signal", "fixed_wait", "fast_reset")
"""Settings that, when set, override the :class:`DesktopConfig`'s field of the same name."""


def _setting(default: Any, description: str, *, rule: str, resume: bool = False, **kw: Any):
    """A field of :class:`CollectSettings`: ``rule`` is what a valid value is (for the error
    message), ``resume`` whether a resumed run must have the same value."""
    return Field(
        default, description=description, json_schema_extra={"rule": rule, "resume": resume}, **kw
    )


class CollectSettings(BaseModel):
    """The knobs of one collection (units in the descriptions). Field order is the order of
    ``run.json``'s ``knobs``."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    group: int = _setting(
        4,
        "Attempts per task: one GRPO group.",
        rule="attempts per task must be an integer >= 1",
        resume=True,
        ge=1,
        strict=True,
    )
    oversample: float = _setting(
        0.0,
        "Extra attempts per group, as a fraction of group: ceil(group x oversample).",
        rule="must be >= 0 (a fraction of group)",
        resume=True,
        ge=0,
    )
    max_steps: int = _setting(
        15,
        "Policy calls per attempt; reaching it ends the attempt as ok.",
        rule="must be >= 1",
        resume=True,
        ge=1,
    )
    max_inflight: int | None = _setting(
        None,
        "Cap on concurrent model requests (default: one per desktop).",
        rule="must be >= 1 or unset",
        ge=1,
    )
    step_timeout: float = _setting(
        PolicyConfig.model_fields["step_timeout"].default,
        "Seconds per model call: a hard deadline, even if the server trickles bytes.",
        rule="must be > 0 seconds",
        gt=0,
    )
    retries: int = _setting(
        PolicyConfig.model_fields["retries"].default,
        "Re-tries of a failed model call (backoff with jitter).",
        rule="must be >= 0",
        ge=0,
    )
    rollout_timeout: float | None = _setting(
        None,
        "Seconds per attempt (wall clock); then graded and marked truncated.",
        rule="must be > 0 seconds or unset",
        gt=0,
    )
    env_retries: int = _setting(
        1, "New executions after a desktop failure.", rule="must be >= 0", ge=0
    )
    ready_signal: bool = _setting(
        True,
        "Wait until the screen is stable after actions and reset (off: fixed_wait).",
        rule="must be true or false",
    )
    fixed_wait: float | None = _setting(
        None,
        "Seconds to sleep after actions instead (the baseline; needs ready_signal off).",
        rule="must be >= 0 seconds or unset",
        ge=0,
    )
    fast_reset: bool = _setting(
        True,
        "Fast reset where the task allows it (off: full restart / snapshot revert).",
        rule="must be true or false",
    )
    image_max: int = _setting(
        20,
        "Screenshots kept in the prompt (prefix-cache friendly).",
        rule="must be >= 1",
        resume=True,
        ge=1,
    )
    harness: Literal["qwen3vl", "qwen25vl"] = _setting(
        "qwen3vl",
        "Prompt and action format: qwen3vl | qwen25vl.",
        rule="must be qwen3vl or qwen25vl",
        resume=True,
    )
    history: Literal["window", "hysteresis"] = _setting(
        "window",
        "How old screenshots leave the prompt: window | hysteresis.",
        rule="must be window or hysteresis",
        resume=True,
    )

    @field_validator("harness", "history", mode="before")
    @classmethod
    def _lower_case(cls, value: Any) -> Any:
        """The names are matched without case (``--harness Qwen3VL``), stored lower-case."""
        return value.strip().lower() if isinstance(value, str) else value

    desktops: int = _setting(4, "Desktops run at once, one worker each.", rule="must be >= 1", ge=1)
    spares: int | None = _setting(
        None,
        "Spare desktops, reset and set up for the next queued attempts while the policy drives "
        "the others (0: off; unset: one per desktop on the local backend with 2+ desktops).",
        rule="must be >= 0 or unset",
        ge=0,
    )
    seed: int = _setting(
        0,
        "Seeds attempt seeds (the fake backend's rewards); a resume keeps the run's.",
        rule="must be an integer",
        resume=True,
    )

    @classmethod
    def default(cls, name: str) -> Any:
        """The default of setting ``name``."""
        return cls.model_fields[name].default

    @classmethod
    def checked(cls, values: Mapping[str, Any] | None = None, /, **kw: Any) -> CollectSettings:
        """The settings from ``values`` and keywords (the rest take their defaults). Raises
        ``ConfigError`` naming the setting, what a valid value is and the flag to change, e.g.
        ``group: attempts per task must be an integer >= 1, got 0 (fix: --group)``."""
        data = {**(values or {}), **kw}
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise settings_error(exc) from None

    def overrides(self, names: tuple[str, ...]) -> dict[str, Any]:
        """The settings among ``names`` that were set explicitly (not left at their default)."""
        return {n: getattr(self, n) for n in names if n in self.model_fields_set}

    def knobs(self, *, backend: str, desktops: int) -> dict[str, Any]:
        """``run.json``'s ``knobs``: every setting (``desktops``: how many ran) plus the
        desktop ``backend``, in the order the format has always had."""
        knobs = self.model_dump(exclude={"desktops", "spares", "seed"})
        return knobs | {
            "backend": backend,
            "desktops": desktops,
            "spares": self.spares,
            "seed": self.seed,
        }


def attached_servers(options: Mapping[str, Any]) -> int:
    """How many desktops a batch can open with the local backend's option ``urls``: the servers
    listed plus option ``local`` (desktops started here besides them, ``desktops/server/remote.py``);
    0 when ``urls`` is not set (every desktop is started here, as many as asked)."""
    urls = options.get("urls") or ()
    return len(urls) + int(options.get("local") or 0) if urls else 0


def spare_desktops(spares: int | None, *, desktops: int, backend: str, attached: int = 0) -> int:
    """How many spare desktops a batch of ``desktops`` runners opens (issue 18, "reset off the
    critical path"): ``spares`` when set, else one per runner on a backend whose capability
    ``default_spares`` says so (:mod:`..desktops.registry`: the ``local`` backend) with
    two desktops or more started on this host (a spare costs a desktop's memory and its
    resets' CPU: BENCHMARKS.md), none for a single desktop, for servers attached by URL, for
    the ``fake`` backend (nothing to gain) and for ``osworld`` (a spare is a whole VM or
    DesktopEnv: opt in with ``--spares``).

    ``attached``: how many servers the desktop option ``urls`` lists (0: desktops are started
    here). Every runner and every spare takes one of them, so ``desktops + spares`` servers
    are needed: fewer raises ``ConfigError`` naming both counts and the fix, before anything
    starts (extra URLs are left unused)."""
    if spares is None:
        by_default = capabilities(backend).default_spares  # the local backend's
        spares = desktops if by_default and desktops >= 2 and not attached else 0
    if attached and desktops + spares > attached:
        raise ConfigError(
            f"desktop option 'urls' lists {attached} server(s), but {desktops} desktop(s) "
            f"(--desktops) + {spares} spare(s) (--spares) need {desktops + spares}, one server "
            f"each (fix: list {desktops + spares} URLs, or lower --desktops/--spares)"
        )
    return spares


RESUME_SETTINGS: tuple[str, ...] = tuple(
    name
    for name, field in CollectSettings.model_fields.items()
    if (field.json_schema_extra or {}).get("resume")
)
"""Settings a resumed run must share with the run it continues (they change what a record
means); with the desktop ``backend`` they are ``run.json`` knobs checked on resume."""


def flag(name: str) -> str:
    """The ``legato collect`` flag of setting ``name`` (``--max-steps``; for the switches the
    one that turns the default off: ``--no-ready-signal``)."""
    dashed = name.replace("_", "-")
    field = CollectSettings.model_fields.get(name)
    if field is not None and field.annotation is bool and field.default is True:
        return f"--no-{dashed}"
    return f"--{dashed}"


def settings_error(exc: ValidationError) -> ConfigError:
    """A ``ConfigError`` for the first problem in ``exc`` (a validation of
    :class:`CollectSettings`), naming the setting, its rule, the value and the flag."""
    first = exc.errors()[0]
    name = str(first["loc"][0]) if first["loc"] else "settings"
    field = CollectSettings.model_fields.get(name)
    if field is None:
        return ConfigError(f"{name}: not a collection setting ({first['msg']})")
    rule = (field.json_schema_extra or {}).get("rule") or first["msg"]
    return ConfigError(f"{name}: {rule}, got {first.get('input')!r} (fix: {flag(name)})")
