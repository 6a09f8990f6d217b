"""Putting a policy version into the model server, proving it, and fingerprinting checkpoints.

A policy version is only worth its label if the server serves that version's weights. Before a
batch starts (before any desktop), :func:`plan_load` looks at the checkpoint folder (its
:func:`fingerprint`) and at the server (which kind it is), and :func:`load_version` puts the
checkpoint into the server and checks that the server serves it. Modes (:data:`LOAD_MODES`):

``lora``      the folder is a LoRA adapter (``adapter_config.json``), loaded under the version's
              name: vLLM ``POST /v1/load_lora_adapter`` (needs ``--enable-lora`` and
              ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` in the server's environment) and called
              as model ``<version>``; SGLang ``POST /load_lora_adapter`` (``--enable-lora``) and
              called as model ``<base>:<version>``. An adapter already served under the
              name from the folder is kept only when it was loaded with the folder's current
              fingerprint (:mod:`.servers`), else unloaded and loaded again, once no other live
              run leases it (waiting ``wait`` seconds at most, then failing naming that run:
              weights are never swapped under a run calling them). Adapters loaded
              earlier from the same checkpoints directory are unloaded past ``keep`` (the
              newest stay), never one that a live run leases (calls).
              Proof: vLLM lists the adapter in ``/v1/models`` with ``root`` = the folder;
              SGLang's answer lists it in ``loaded_adapters`` with that path.
``weights``   the folder holds full weights (``config.json``): SGLang
              ``POST /update_weights_from_disk {"model_path": folder}``; vLLM has no such route
              of its own, so the team's route is configured (``weights_route``, default
              ``/update_weights`` as prime-rl's server adds it; ``weights_payload`` with
              ``{checkpoint}`` / ``{version}`` placeholders). The base model id is called.
              Proof: SGLang's ``/get_model_info`` ``model_path`` = the folder; for vLLM the
              route's success answer (vLLM reports no weights path), checked against the path
              it names when it names one (``model_path``, ``checkpoint`` or ``path``).
              Full weights replace what every caller gets: one version at a time per server,
              so the run holds the server's weights lock (:mod:`.servers`) from before it
              loads until its collection ends; a second ``weights`` run waits.
``external``  the trainer loads the weights itself; nothing is loaded, the run only verifies:
              ``/v1/models`` lists the version's name (``adapter``, default the version) with
              ``root`` the folder when it names one, or SGLang's ``model_path`` is the folder.
              Otherwise the run refuses to start.

After collecting, :func:`verify_served` checks the proof again (``model_path``, the adapter's
listing; for a vLLM weights route that reported the path it loaded, a ``GET`` of the route when
it answers with the path, so a swap by another host is caught too) and fails the run when the server serves other weights now. A 401/403 from a load
route or ``/v1/models`` says ``fix: set LEGATO_POLICY_KEY``.
``none``      today's behaviour, named as such: the configured model is called, nothing is
              loaded or checked; the run records that the tie is unproven.

The requests differ per server kind: :mod:`.loaders` has one loader class per kind (vLLM,
SGLang) chosen from one table (``LOADERS``); this module is the flow they share. What a load
is and what was proven are :mod:`.load_spec`; checkpoint folders on disk (fingerprint, still
being written) :mod:`.checkpoint_files`.

Errors are :class:`~legato_pipelines.errors.LoadError` (a ``ConfigError``) quoting the
server's answer, or saying what is wrong with the folder, and naming the setting to change. The API key (``LEGATO_POLICY_KEY``) is sent as a bearer token and never
appears in a message, a proof or a record.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import httpx

from ..errors import LoadError
from .checkpoint_files import (  # noqa: F401  (names of this module before the split)
    FINGERPRINT_FILES,
    HASH_LIMIT,
    SAMPLE_BYTES,
    TEMPORARY_NAME,
    _digest,
    fingerprint,
    incomplete,
    same_fingerprint,
)
from .config import PolicyConfig
from .load_spec import LOAD_MODES, LoadMode, LoadPlan, LoadSpec, ServerKind  # noqa: F401
from .loaders import LOADERS, auth_headers, detect_kind, loader_for, server_root
from .servers import ServerState, release_path


async def plan_load(spec: LoadSpec, policy: PolicyConfig) -> LoadPlan:
    """Check the spec against the checkpoint folder and the server, changing nothing: the
    folder exists and holds what the mode needs, its :func:`fingerprint`, the server kind
    (``auto``: one ``GET /get_model_info``), and the model id the batch will call (``external``
    is verified here: it only reads).

    Raises ``LoadError`` (no folder, a folder of the wrong kind, the server cannot be reached,
    ``external``: the version is not served), naming the setting to change; ``ConfigError`` is
    its base class."""
    path = spec.checkpoint
    if spec.mode in ("lora", "weights") and not path:
        raise LoadError(
            f"load {spec.mode!r} needs the version's checkpoint folder (fix: --checkpoint PATH)"
        )
    prints = fingerprint(path) if path else None
    if path:
        path = str(Path(path).resolve())
        need = {"lora": "adapter_config.json", "weights": "config.json"}.get(spec.mode)
        if need and not (Path(path) / need).is_file():
            other = "weights" if spec.mode == "lora" else "lora"
            raise LoadError(
                f"load {spec.mode!r}: {path} has no {need} (is it a "
                f"{'full-weights' if spec.mode == 'lora' else 'LoRA adapter'} checkpoint? "
                f"fix: --load {other}, or --checkpoint the right folder)"
            )
    plan = LoadPlan(
        spec=spec,
        version=policy.version,
        server=None,
        model=policy.model,
        base_model=policy.model,
        checkpoint=path,
        fingerprint=prints,
        root=server_root(policy),
    )
    if spec.mode == "none":
        return plan
    plan.server = spec.server if spec.server != "auto" else await detect_kind(plan)
    kind = LOADERS[plan.server]
    plan.lists_adapters = kind.lists_adapters
    if spec.mode == "lora":
        plan.model = kind.adapter_model(policy.model, plan.adapter)
    elif spec.mode == "external":  # read-only: verified now, so the model id is known
        async with httpx.AsyncClient(timeout=30.0, headers=auth_headers()) as http:
            await loader_for(plan, http).external()
    return plan


async def load_version(plan: LoadPlan) -> LoadPlan:
    """Load the plan's checkpoint into the server (``lora``, ``weights``) or verify that it is
    served (``external``), then prove it; ``none`` does nothing. Fills ``plan.proof`` (what
    shows the server serves the version) and, for ``external``, ``plan.model``. Returns the plan.

    What it holds until :func:`release` (:mod:`.servers`): a ``weights`` run the server's
    weights lock (waiting ``spec.wait`` seconds at most for another run of this host that
    holds it), a ``lora`` / ``external`` run a lease on its adapter, so that no other run's
    ``keep`` limit unloads it while this run calls it. Call :func:`release` when the
    collection ends, whatever happened.

    Raises ``LoadError`` quoting the server's answer (status and words) and naming the setting
    to change; nothing has been collected then."""
    if plan.spec.mode == "none":
        plan.proof = {"kind": "none", "detail": "not loaded, not checked (load mode none)"}
        return plan
    state = plan.state or ServerState(plan.root)
    plan.state = state
    holder = {
        "version": plan.version,
        "checkpoint": plan.checkpoint,
        "mode": plan.spec.mode,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.time(),
    }
    if plan.spec.mode == "weights":
        plan.held.append(await state.lock_weights(holder, plan.spec.wait))
    elif plan.spec.mode == "lora" or plan.listed_model != plan.base_model:
        plan.held.append(state.lease(plan.adapter, holder))
    async with httpx.AsyncClient(timeout=plan.spec.timeout, headers=auth_headers()) as http:
        loader = loader_for(plan, http)
        if plan.spec.mode == "lora":
            await loader.lora()
        elif plan.spec.mode == "weights":
            await loader.weights()
        elif not plan.proof:  # external: verified by plan_load already
            await loader.external()
    return plan


def release(plan: LoadPlan | None) -> None:
    """Give back what :func:`load_version` holds (the weights lock, adapter leases);
    idempotent."""
    if plan is None:
        return
    while plan.held:
        item = plan.held.pop()
        if isinstance(item, Path):
            release_path(item)
        else:
            item.release()


async def verify_served(plan: LoadPlan) -> dict[str, Any]:
    """Check, after collecting, that the server still serves what :func:`load_version` proved
    (SGLang's ``model_path``, the adapter still listed in ``/v1/models`` with its folder, or the
    path a ``GET`` of the vLLM weights route reports when that route reported one on loading).
    Returns ``{"checked": bool, "detail": str}`` for ``run.json`` (``checked`` False when the
    server reports nothing to check: a vLLM weights route that names no path, SGLang adapters). Raises ``LoadError``
    when the server serves something else now: the records may mix weights."""
    kind = plan.proof.get("kind")
    if plan.spec.mode == "none" or kind is None:
        return {"checked": False, "detail": "load none: nothing to check"}
    async with httpx.AsyncClient(timeout=30.0, headers=auth_headers()) as http:
        checked = await loader_for(plan, http).verify(kind)
    if checked is not None:
        return checked
    return {
        "checked": False,
        "detail": "the server reports nothing to re-check for this proof "
        f"({kind}); the weights lock kept other runs of this host from loading"
        if plan.spec.mode == "weights"
        else f"the server reports nothing to re-check for this proof ({kind})",
    }


async def adapter_gone(plan: LoadPlan) -> str | None:
    """When a call for the plan's adapter failed with a 404: the explanation, if the adapter
    is no longer served (unloaded by another run), else ``None``."""
    unlisted_adapter = plan.spec.mode == "lora" and not plan.lists_adapters  # called base:adapter
    if plan.spec.mode not in ("lora", "external") or (
        plan.listed_model == plan.base_model and not unlisted_adapter
    ):
        return None
    try:
        async with httpx.AsyncClient(timeout=10.0, headers=auth_headers()) as http:
            listed = {m["id"] for m in await loader_for(plan, http).models()}
    except LoadError:
        return None
    if plan.listed_model in listed and not unlisted_adapter:
        return None
    if unlisted_adapter and plan.base_model not in listed:
        return None
    return (
        f"adapter {plan.adapter!r} (model {plan.model!r}) was unloaded from the policy server "
        f"while this run of {plan.version!r} called it, most likely by another run keeping only "
        f"its newest adapters (fix: LEGATO_POLICY_LOAD_KEEP / --load-keep at least the number "
        "of versions collected at once, plus one; then resume this run)"
    )
