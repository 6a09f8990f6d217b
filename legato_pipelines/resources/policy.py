"""``PolicyResource``: the OpenAI-compatible policy server a batch calls.

The API key is a resource field set with ``EnvVar("LEGATO_POLICY_KEY")`` (Dagster resolves it
when a run starts; the UI and the run config show only the variable's name). It never goes
into metadata, logs or ``repr``. The engine reads the key from ``LEGATO_POLICY_KEY`` only
(:mod:`legato_pipelines.policy.config`), so :meth:`PolicyResource.credentials` exposes the
resolved key there for the duration of a collection, whatever variable the deployment used.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import BaseModel, Field, create_model
from pydantic.fields import FieldInfo

from ..errors import ConfigError, LoadError
from ..policy.config import API_KEY_ENV, PolicyConfig
from ..policy.load_spec import LoadSpec
from ..setting_fields import exposure, from_user, unchecked, user_settings


class _PolicyResource(dg.ConfigurableResource):
    """Where the policy is served.

    Fields: ``base_url`` (server root, ``http://HOST:PORT`` or ``.../v1``; no default: a
    deployment names its server, so a run never calls a port that happens to be free), ``model`` (the
    ``/v1/models`` id), ``api_key`` (secret: ``EnvVar`` only), ``checkpoint_root``, and the
    settings generated from the engine's models (:mod:`legato_pipelines.setting_fields`):
    sampling (``temperature``, ``top_p``, ``max_tokens`` [tokens], ``sampling_seed``;
    ``logprobs_mode`` recorded; ``extra_body``: server-specific request fields) from
    :class:`~legato_pipelines.policy.config.PolicyConfig`, and loading from
    :class:`~legato_pipelines.policy.load_spec.LoadSpec`.
    The policy *version* is not a field: it is the partition key of the run.

    How a version reaches the server (:mod:`legato_pipelines.policy.loading`; ``legato collect
    --load``): ``load`` (``none`` | ``lora`` | ``weights`` | ``external``; LEGATO_POLICY_LOAD),
    ``load_server`` (auto | vllm | sglang), ``load_keep`` [adapters], ``weights_route`` and
    ``weights_payload`` (a vLLM full-weights route), ``load_timeout`` [s] per load request,
    ``load_wait`` [s] a weights run waits for the server's weights lock, ``checkpoint_root`` (where a version's
    folder ``<root>/<version>`` is when the run's ``legato/checkpoint`` tag, set by the
    checkpoint sensor, does not name it; LEGATO_CHECKPOINTS).
    """

    base_url: str | None = Field(
        default=None,
        description="Policy server root, e.g. http://127.0.0.1:8000 (LEGATO_POLICY_URL); "
        "required: a run without it fails at once, naming the variable.",
    )
    model: str = Field(
        description="Served model id, as listed by /v1/models (LEGATO_POLICY_MODEL)."
    )
    api_key: str | None = Field(
        default=None,
        repr=False,
        description="Bearer key; set it with EnvVar('LEGATO_POLICY_KEY'), never as a literal.",
    )
    checkpoint_root: str | None = Field(
        default=None,
        description="Checkpoints directory: a version's folder is <root>/<version> unless the "
        "run's legato/checkpoint tag names it (LEGATO_CHECKPOINTS).",
    )

    def _settings(self, model: type[BaseModel]) -> dict[str, Any]:
        """This resource's fields generated from ``model``, as ``model``'s keyword arguments."""
        return from_user(model, {n: getattr(self, n) for n in type(self).model_fields}, "dagster")

    def config(self, version: str, *, model: str | None = None) -> PolicyConfig:
        """The engine's :class:`PolicyConfig` for one policy version (the partition key).

        ``model`` overrides the resource's model (the checkpoint sensor's ``models`` mode runs
        a newly loaded adapter). Raises ``ConfigError`` when ``base_url`` is not set,
        ``pydantic.ValidationError`` naming any other bad field.
        """
        return PolicyConfig(
            base_url=self.api_base(),
            model=model or self.model,
            version=version,
            **self._settings(PolicyConfig),
        )

    def load_spec(
        self, version: str, checkpoint: str | None = None, *, adapter: str | None = None
    ) -> LoadSpec:
        """The engine's :class:`~legato_pipelines.policy.loading.LoadSpec` for ``version``:
        the checkpoint folder is ``checkpoint`` (the run's ``legato/checkpoint`` tag), else
        ``<checkpoint_root>/<version>`` when that folder exists (``lora`` and ``weights``
        fail naming the path they looked for when it does not), else none (``lora`` and
        ``weights`` then fail naming the setting); ``adapter`` the version's served name
        (default: the version). Raises ``ConfigError`` for a bad field."""
        if checkpoint is None and self.checkpoint_root:
            candidate = Path(self.checkpoint_root) / version
            if candidate.is_dir():
                checkpoint = str(candidate)
            elif self.load in ("lora", "weights"):
                raise LoadError(
                    f"load {self.load!r} needs the checkpoint folder of version {version!r}: the "
                    f"run has no legato/checkpoint tag and {candidate} "
                    f"({'is not a directory' if candidate.exists() else 'does not exist'}; "
                    "LEGATO_CHECKPOINTS/<version>) (fix: the folder there, LEGATO_CHECKPOINTS, "
                    "or the legato/checkpoint tag on the run)"
                )
        return LoadSpec.checked(**self._settings(LoadSpec), checkpoint=checkpoint, adapter=adapter)

    def api_base(self) -> str:
        """``base_url``; raises ``ConfigError`` naming LEGATO_POLICY_URL when it is not set."""
        if not self.base_url:
            raise ConfigError(
                "policy: no policy server configured (fix: set LEGATO_POLICY_URL to the "
                "OpenAI-compatible server root, e.g. http://127.0.0.1:8000 for vLLM on this host, "
                "and LEGATO_POLICY_MODEL to its model; or the policy resource's base_url)"
            )
        return self.base_url

    @contextmanager
    def credentials(self) -> Iterator[None]:
        """Expose :attr:`api_key` as ``LEGATO_POLICY_KEY`` (where the engine reads it) while the
        block runs; restore the previous environment afterwards. No key: nothing changes."""
        if not self.api_key:
            yield
            return
        previous = os.environ.get(API_KEY_ENV)
        os.environ[API_KEY_ENV] = self.api_key
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop(API_KEY_ENV, None)
            else:
                os.environ[API_KEY_ENV] = previous

    def list_models(self) -> list[str]:
        """Model ids served at ``GET <base>/v1/models``, asked as ``legato collect`` asks
        (:meth:`~legato_pipelines.policy.client.PolicyClient.list_models`: one call, at most
        30 s), so the errors are the CLI's: ``ConfigError`` when ``base_url`` is not set,
        ``PolicyConfigError`` (a ``ConfigError``) naming the URL and the fix when the server
        is unreachable (``fix --policy-url``), refuses the key (``fix: set
        LEGATO_POLICY_KEY``) or answers no model list. Never names the key.
        """
        from ..policy.client import PolicyClient

        config = self.config("v0")  # the version is not sent: listing needs none

        async def ask() -> list[str]:
            async with PolicyClient(config) as client:
                return await client.list_models()

        with self.credentials():
            return asyncio.run(ask())


def _resource_field(field: FieldInfo) -> FieldInfo:
    """A resource field from an engine model's field: its default and description (and the
    variable that sets it, named). A field a variable sets keeps no bounds or validators: the
    variable is checked when the code location loads (:mod:`.defaults`), and an
    ``EnvVar.int`` placeholder would fail a bound before it is resolved; every value is checked
    by the engine model when a run builds its config (the error names the setting)."""
    meta = exposure(field)
    env = meta.get("env")
    description = f"{field.description.rstrip('.')} ({env})." if env else field.description
    if env:
        return unchecked(field, description)
    return FieldInfo.merge_field_infos(field, description=description)


PolicyResource = create_model(
    "PolicyResource",
    __base__=_PolicyResource,
    __module__=__name__,
    __doc__=_PolicyResource.__doc__,
    **{
        name: (field.annotation, _resource_field(field))
        for model in (PolicyConfig, LoadSpec)
        for name, (_, field) in user_settings(model, "dagster").items()
    },
)
