"""One loader per kind of model server: the requests that put a checkpoint into it, prove it
and check it again (:mod:`.loading` runs the flow; the modes are described there).

:class:`ServerLoader` holds what every kind shares (requests, errors, ``/v1/models``, adapter
leases and the ``keep`` limit, the ``external`` check); a subclass per kind holds its routes:
:class:`VllmLoader` (``/v1/load_lora_adapter``, a configured full-weights route) and
:class:`SGLangLoader` (``/load_lora_adapter``, ``/update_weights_from_disk``,
``/get_model_info``). :data:`LOADERS` is the one table of kinds (``--load-server``);
:func:`detect_kind` picks one for ``auto``.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any, ClassVar

import httpx

from ..errors import LoadError
from .config import PolicyConfig, policy_api_key
from .load_spec import LoadPlan
from .servers import POLL_S
from .wire import error_text, redact


def server_root(policy: PolicyConfig) -> str:
    """The server root load routes hang off (the policy URL without a trailing ``/v1``)."""
    base = policy.base_url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def auth_headers() -> dict[str, str]:
    """The bearer header of ``LEGATO_POLICY_KEY`` (none when it is not set)."""
    key = policy_api_key()
    return {"Authorization": f"Bearer {key}"} if key else {}


def key_refused(plan: LoadPlan, route: str, resp: httpx.Response) -> LoadError:
    """A 401/403 from a load route or ``/v1/models``: the key is wrong or missing (the key
    itself is never quoted)."""
    sent = "a key" if policy_api_key() else "no key"
    return LoadError(
        f"the policy server at {plan.root} refused {route} (HTTP {resp.status_code}: "
        f"{_answer(resp)}) while loading {plan.version!r}; {sent} was sent (fix: set "
        "LEGATO_POLICY_KEY to the server's API key, e.g. vLLM's / SGLang's --api-key)"
    )


class ServerLoader:
    """The requests of one load on one server (``plan.root``), with ``http`` (its timeout is
    the load timeout). A subclass per server kind sets the class attributes and implements
    :meth:`lora` and :meth:`weights`; the rest is shared. Every method raises ``LoadError``
    quoting the server's answer and naming the setting to change."""

    kind: ClassVar[str]
    """The ``--load-server`` name of the kind."""
    lists_adapters: ClassVar[bool] = True
    """Whether ``/v1/models`` lists a loaded adapter under its name (what is then called)."""
    identifying_route: ClassVar[str | None] = None
    """A ``GET`` route only this kind answers with 200 (``auto`` detection; ``None``: the kind
    taken when no other kind's route answers)."""

    def __init__(self, plan: LoadPlan, http: httpx.AsyncClient):
        self.plan = plan
        self.http = http

    @classmethod
    def adapter_model(cls, base: str, adapter: str) -> str:
        """The model id a batch calls to be answered by ``adapter`` loaded on base ``base``."""
        return adapter

    async def lora(self) -> None:
        """Load the plan's adapter folder under ``plan.adapter`` and prove it (``plan.proof``)."""
        raise NotImplementedError

    async def weights(self) -> None:
        """Load the plan's full-weights folder and prove it (``plan.proof``)."""
        raise NotImplementedError

    async def served_path_proof(self) -> dict[str, Any] | None:
        """For ``external`` when ``/v1/models`` does not list the version: a proof that the
        server's base weights are the checkpoint folder, or ``None`` (this kind cannot tell)."""
        return None

    async def verify(self, kind: str) -> dict[str, Any] | None:
        """After the run: re-check a proof of ``kind`` (``plan.proof["kind"]``). Returns
        ``{"checked": True, "detail": ...}``, or ``None`` when the server reports nothing to
        re-check; raises ``LoadError`` when it serves other weights now."""
        if kind != "models_listing":
            return None
        plan = self.plan
        listed = {m["id"]: m for m in await self.models()}
        entry = listed.get(plan.adapter)
        root = None if entry is None else entry.get("root")
        if entry is None or (
            isinstance(root, str)
            and plan.checkpoint
            and root != plan.adapter  # a base model's root is its id, not a folder
            and _resolved(root) != _resolved(plan.checkpoint)
        ):
            now = "is no longer listed" if entry is None else f"is listed from {root}"
            raise LoadError(
                f"adapter {plan.adapter!r} {now} in /v1/models after the run of "
                f"{plan.version!r}: another run unloaded or replaced it, so later requests "
                "may have failed or come from other weights (fix: LEGATO_POLICY_LOAD_KEEP / "
                "--load-keep above the number of versions collected at once)"
            )
        return {"checked": True, "detail": f"/v1/models lists {plan.adapter!r} from {root!r}"}

    # -- requests ---------------------------------------------------------------------------

    async def post(self, route: str, body: dict[str, Any]) -> httpx.Response:
        """``POST`` ``body`` to ``route``; raises ``LoadError`` on a timeout or no connection."""
        url = self.plan.root + route
        try:
            return await self.http.post(url, json=body)
        except httpx.TimeoutException:
            raise LoadError(
                f"{url} did not answer within {self.plan.spec.timeout:g} s while loading "
                f"{self.plan.version!r} (fix: the load timeout, or the server)"
            ) from None
        except httpx.HTTPError as exc:
            raise LoadError(
                f"cannot reach {url} to load {self.plan.version!r}: {type(exc).__name__}: "
                f"{redact(str(exc))} (fix: --policy-url)"
            ) from None

    async def get_json(self, route: str) -> Any:
        """The JSON a ``GET`` answers, ``None`` when there is none; raises ``LoadError`` on a
        401/403 (the key)."""
        try:
            resp = await self.http.get(self.plan.root + route, timeout=30.0)
        except httpx.HTTPError:
            return None
        if resp.status_code in (401, 403):
            raise key_refused(self.plan, route, resp)
        if resp.status_code != 200:
            return None
        try:
            return resp.json()
        except ValueError:
            return None

    def refused(self, route: str, resp: httpx.Response, fix: str) -> LoadError:
        """The ``LoadError`` of a load route's refusal: the key (401/403), else the route's
        status and words and ``fix``; a 404 of the route itself also names the other kinds."""
        if resp.status_code in (401, 403):
            return key_refused(self.plan, route, resp)
        if resp.status_code == 404 and _not_found_route(resp):
            other = " / ".join(k for k in LOADERS if k != self.kind)
            how = "as set" if self.plan.spec.server != "auto" else "as detected"
            fix += (
                f"; or --load-server {other} if this is a {other} server (taken for "
                f"{self.kind} {how})"
            )
        return LoadError(
            f"the policy server refused to load {self.plan.version!r} from {self.plan.checkpoint}: "
            f"{route} answered HTTP {resp.status_code}: {_answer(resp)} (fix: {fix})"
        )

    async def models(self) -> list[dict[str, Any]]:
        """The entries of ``GET /v1/models`` (each with an ``id``)."""
        data = await self.get_json("/v1/models")
        items = (data or {}).get("data") if isinstance(data, dict) else None
        return [m for m in items or [] if isinstance(m, dict) and "id" in m]

    # -- adapters: leases, the keep limit ---------------------------------------------------

    async def wait_unleased(self, name: str) -> None:
        """Before replacing adapter ``name`` (unload and load again under the same name): wait
        at most ``spec.wait`` seconds for the other live runs that lease it to end; raises
        ``LoadError`` naming one of them when they are still there. Weights are never swapped
        under a run that calls them."""
        state = self.plan.state
        if state is None:
            return
        mine = next((p for p in self.plan.held if isinstance(p, Path)), None)
        deadline = time.monotonic() + self.plan.spec.wait
        while others := state.leased(name, mine=mine):
            if time.monotonic() >= deadline:
                holder = others[0]
                raise LoadError(
                    f"adapter {name!r} must be replaced (loaded from another folder, or its "
                    f"folder changed) to load {self.plan.checkpoint}, but a live run still calls "
                    f"it (version {holder.get('version')!r}, pid {holder.get('pid')} on "
                    f"{holder.get('host', '?')}) and still did after {self.plan.spec.wait:g} s; "
                    "nothing was replaced (fix: wait for that run, --load-wait longer, or "
                    "another --load adapter name for this version)"
                )
            await asyncio.sleep(POLL_S)

    async def unload_old(self, ours: list[str], route: str) -> None:
        """Unload the oldest of ``ours`` (adapters from the same checkpoints directory, in load
        order) so that ``keep`` stay loaded with the new one. A failed unload is noted in the
        proof, not raised: the new version is loaded and proven."""
        excess = len(ours) + 1 - self.plan.spec.keep
        unloaded, failed, in_use = [], [], []
        state = self.plan.state
        for name in ours:
            if excess <= 0:
                break
            if state is not None and state.leased(name):
                in_use.append(name)  # a live run calls it: never unloaded under it
                continue
            resp = await self.post(route, {"lora_name": name})
            (unloaded if resp.status_code == 200 else failed).append(name)
            if resp.status_code == 200 and state is not None:
                state.remember(name, None, None)
            excess -= 1
        if unloaded:
            self.plan.proof["unloaded"] = unloaded
        if failed:
            self.plan.proof["unload_failed"] = failed
        if in_use:
            self.plan.proof["kept_in_use"] = in_use

    def unchanged(self) -> bool:
        """Whether the adapter was loaded from here with the folder's current fingerprint (an
        adapter of unknown origin, or loaded before the folder was rewritten, is reloaded)."""
        state, plan = self.plan.state, self.plan
        known = state.loaded(plan.adapter) if state is not None else None
        return bool(
            known
            and known.get("path") == plan.checkpoint
            and known.get("fingerprint") == (plan.fingerprint or {}).get("digest")
        )

    def remember(self) -> None:
        """Note in the server state that the plan's adapter is loaded from its folder now."""
        if self.plan.state is not None:
            self.plan.state.remember(
                self.plan.adapter, self.plan.checkpoint, (self.plan.fingerprint or {}).get("digest")
            )

    # -- external ---------------------------------------------------------------------------

    async def external(self) -> None:
        """``external``: check, changing nothing, that the server serves the version (listed
        under ``plan.adapter`` with the checkpoint as root, or :meth:`served_path_proof`);
        sets ``plan.model`` and ``plan.proof``."""
        plan = self.plan
        listed = {m["id"]: m for m in await self.models()}
        name = plan.adapter
        if name in listed:
            root = listed[name].get("root")
            if (
                isinstance(root, str)
                and root != name
                and os.path.isabs(root)
                and _resolved(root) != _norm(root)
            ):
                raise LoadError(
                    f"load 'external': /v1/models lists {name!r} with root {root!r}, which goes "
                    f"through a symlink (now to {_resolved(root)}): the server loaded through a "
                    "symlink whose target may have changed since, so what it serves cannot be "
                    "told from the folder; nothing was collected (fix: have the trainer load "
                    "adapters by their real folder, not through a symlink such as ckpt/current)"
                )
            if (
                isinstance(root, str)
                and plan.checkpoint
                and root != name  # vLLM's root of a base model is its id, not a folder
                and _resolved(root) != _resolved(plan.checkpoint)
            ):
                raise LoadError(
                    f"load 'external': /v1/models lists {name!r} with root {root!r}, not the "
                    f"checkpoint {plan.checkpoint}: the server serves other weights under this "
                    "name; nothing was collected (fix: --checkpoint the folder the trainer "
                    f"loaded, or have the trainer load {plan.checkpoint} as {name!r})"
                )
            plan.model = name
            plan.proof = {
                "kind": "models_listing",
                "detail": f"/v1/models lists {name!r} with root {listed[name].get('root')!r}",
            }
            return
        if plan.checkpoint:
            proof = await self.served_path_proof()
            if proof is not None:
                plan.model = plan.base_model
                plan.proof = proof
                return
        raise LoadError(
            f"load 'external': the policy server does not serve version {plan.version!r}: "
            f"/v1/models lists {', '.join(sorted(listed)) or 'nothing'}"
            + self.external_unserved_note
            + "; nothing was collected (fix: have the trainer load the checkpoint as adapter "
            f"{name!r} before the run, --load lora / weights to load it from here, or "
            "--load none to collect without proof)"
        )

    external_unserved_note: ClassVar[str] = ""
    """What else :meth:`external` looked at, for its error (after the ``/v1/models`` list)."""


class VllmLoader(ServerLoader):
    """vLLM: adapters through its runtime LoRA routes (``--enable-lora`` and
    ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``), listed in ``/v1/models`` with ``root`` = the
    folder; full weights through the team's configured route (``weights_route``: vLLM has
    none of its own)."""

    kind = "vllm"

    async def lora(self) -> None:
        plan, name = self.plan, self.plan.adapter
        listed = {m["id"]: m for m in await self.models()}
        if name in listed and listed[name].get("root") == plan.checkpoint and self.unchanged():
            plan.proof["kept"] = "already served from this folder with this fingerprint"
        else:
            if name in listed:  # the name serves other weights: replace them
                await self.wait_unleased(name)
                await self.post("/v1/unload_lora_adapter", {"lora_name": name})
            route = "/v1/load_lora_adapter"
            resp = await self.post(route, {"lora_name": name, "lora_path": plan.checkpoint})
            if resp.status_code == 404 and _not_found_route(resp):
                raise self.refused(
                    route,
                    resp,
                    "start vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True in "
                    "its environment, or --load weights / external",
                )
            if resp.status_code != 200:
                raise self.refused(
                    route,
                    resp,
                    "--checkpoint a LoRA adapter folder the server can read (the same path on "
                    "the server's host); a base model vLLM serves with --enable-lora and "
                    "--max-lora-rank >= the adapter's rank",
                )
            self.remember()
            listed = {m["id"]: m for m in await self.models()}
        entry = listed.get(name)
        if entry is None:
            raise LoadError(
                f"vLLM accepted adapter {name!r} but /v1/models does not list it "
                f"(it lists {', '.join(sorted(listed)) or 'nothing'}); nothing was collected "
                "(fix: check the server's log)"
            )
        root = entry.get("root")
        if root is not None and root != plan.checkpoint:
            raise LoadError(
                f"/v1/models lists adapter {name!r} from {root}, not {plan.checkpoint} "
                "(fix: unload it on the server, or another --load adapter name)"
            )
        plan.proof = {
            "kind": "models_listing",
            "detail": f"/v1/models lists {name!r} with root {root!r}",
            **plan.proof,
        }
        ours = [
            m["id"]
            for m in listed.values()
            if m.get("parent") and m["id"] != name and _same_dir(m.get("root"), plan.checkpoint)
        ]
        await self.unload_old(ours, "/v1/unload_lora_adapter")

    async def weights(self) -> None:
        plan = self.plan
        route = plan.spec.weights_route
        body = _fill(plan.spec.weights_payload, plan)
        resp = await self.post(route, body)
        if resp.status_code == 404 and _not_found_route(resp):
            raise self.refused(
                route,
                resp,
                "vLLM has no full-weights route of its own: serve with one (e.g. prime-rl's "
                "inference server adds /update_weights) and set --weights-route to it, or "
                "--load lora / external",
            )
        if not 200 <= resp.status_code < 300:
            raise self.refused(
                route, resp, "--weights-payload (the body your route expects), or --checkpoint"
            )
        reported = _reported_path(_json(resp))
        if reported is not None and _norm(reported) != _norm(plan.checkpoint):
            raise LoadError(
                f"{route} answered HTTP {resp.status_code} but reports {reported!r}, not "
                f"{plan.checkpoint}; nothing was collected (fix: --weights-payload, the body "
                "your route expects)"
            )
        plan.proof = {
            "kind": "route_reported_path" if reported else "route_answer",
            "detail": f"{route} answered HTTP {resp.status_code}: {_answer(resp)[:200]}"
            + (
                ""
                if reported
                else " (vLLM reports no weights path: the route's answer is the proof)"
            ),
        }

    async def verify(self, kind: str) -> dict[str, Any] | None:
        if kind != "route_reported_path":
            return await super().verify(kind)
        plan = self.plan
        route = plan.spec.weights_route
        reported = _reported_path(await self.get_json(route))
        if reported is not None and _norm(reported) != _norm(plan.checkpoint):
            raise _weights_changed(plan, f"GET {route} reports {reported!r}")
        if reported is not None:
            return {"checked": True, "detail": f"GET {route} reports {reported!r}"}
        return None


class SGLangLoader(ServerLoader):
    """SGLang: adapters through ``/load_lora_adapter`` (``--enable-lora``), called as
    ``<base>:<adapter>`` and not listed in ``/v1/models`` (its answer's ``loaded_adapters`` is
    the proof); full weights through ``/update_weights_from_disk``, proven by
    ``/get_model_info``'s ``model_path``."""

    kind = "sglang"
    lists_adapters = False
    identifying_route = "/get_model_info"
    external_unserved_note = ", and /get_model_info reports another model_path"

    @classmethod
    def adapter_model(cls, base: str, adapter: str) -> str:
        return f"{base}:{adapter}"

    async def reported_model_path(self) -> str | None:
        """The ``model_path`` ``GET /get_model_info`` reports (``None`` when the server
        reports none); raises ``LoadError`` on a 401/403 (the key)."""
        info = await self.get_json("/get_model_info")
        return info.get("model_path") if isinstance(info, dict) else None

    async def lora(self) -> None:
        plan, name = self.plan, self.plan.adapter
        route = "/load_lora_adapter"
        body = {"lora_name": name, "lora_path": plan.checkpoint}
        resp = await self.post(route, body)
        data = _json(resp)
        if resp.status_code != 200 and "already" in _answer(resp):
            loaded = (data or {}).get("loaded_adapters") or {}
            if loaded.get(name) != plan.checkpoint or not self.unchanged():
                await self.wait_unleased(name)
                await self.post("/unload_lora_adapter", {"lora_name": name})
                resp = await self.post(route, body)
                data = _json(resp)
            else:
                resp = None  # already served from this folder, this fingerprint (a resume)
                plan.proof["kept"] = "already served from this folder with this fingerprint"
        if resp is not None and (resp.status_code != 200 or not (data or {}).get("success")):
            raise self.refused(
                route,
                resp,
                "start SGLang with --enable-lora (and --max-lora-rank / --lora-target-modules "
                "covering the adapter), --checkpoint an adapter folder the server can read, or "
                "--load weights / external",
            )
        if resp is not None:
            self.remember()
        loaded = (data or {}).get("loaded_adapters") or {}
        if loaded and loaded.get(name) != plan.checkpoint:
            raise LoadError(
                f"SGLang lists adapter {name!r} from {loaded.get(name)!r}, not {plan.checkpoint} "
                "(fix: unload it on the server, or another adapter name)"
            )
        plan.proof = {
            "kind": "loaded_adapters" if loaded else "load_answer",
            "detail": f"{route} answered success; loaded_adapters[{name!r}] = {loaded.get(name)!r}",
            **plan.proof,
        }
        ours = [n for n, p in loaded.items() if n != name and _same_dir(p, plan.checkpoint)]
        await self.unload_old(ours, "/unload_lora_adapter")

    async def weights(self) -> None:
        plan = self.plan
        route = "/update_weights_from_disk"
        resp = await self.post(route, {"model_path": plan.checkpoint})
        data = _json(resp)
        if resp.status_code != 200 or not (data or {}).get("success"):
            raise self.refused(
                route,
                resp,
                "--checkpoint a full-weights folder of the served architecture that the "
                "server can read, or --load lora / external",
            )
        reported = await self.reported_model_path()
        if reported is not None and _norm(reported) != _norm(plan.checkpoint):
            raise LoadError(
                f"SGLang answered success but /get_model_info reports model_path "
                f"{reported!r}, not {plan.checkpoint}; nothing was collected "
                "(fix: check the server's log)"
            )
        plan.proof = {
            "kind": "model_path" if reported else "load_answer",
            "detail": f"/get_model_info model_path = {reported!r}"
            if reported
            else f"{route} answered success (the server reports no model path)",
        }

    async def served_path_proof(self) -> dict[str, Any] | None:
        reported = await self.reported_model_path()
        if reported is not None and _resolved(reported) == _resolved(self.plan.checkpoint):
            return {"kind": "model_path", "detail": f"/get_model_info model_path = {reported!r}"}
        return None

    async def verify(self, kind: str) -> dict[str, Any] | None:
        if kind != "model_path":
            return await super().verify(kind)
        plan = self.plan
        reported = await self.reported_model_path()
        if reported is not None and _norm(reported) != _norm(plan.checkpoint):
            raise _weights_changed(plan, f"/get_model_info reports model_path {reported!r}")
        return {"checked": True, "detail": f"/get_model_info model_path = {reported!r}"}


LOADERS: dict[str, type[ServerLoader]] = {cls.kind: cls for cls in (VllmLoader, SGLangLoader)}
"""The server kinds a version can be loaded into (``--load-server``, besides ``auto``), in the
order :func:`detect_kind` asks them."""


def loader_for(plan: LoadPlan, http: httpx.AsyncClient) -> ServerLoader:
    """The loader of the plan's server kind (``plan.server``, one of :data:`LOADERS`)."""
    return LOADERS[plan.server or ""](plan, http)


async def detect_kind(plan: LoadPlan) -> str:
    """The kind of the server at ``plan.root`` (``--load-server auto``): the first kind of
    :data:`LOADERS` whose identifying route answers 200 (SGLang's ``GET /get_model_info``),
    else the kind without one (vLLM). Raises ``LoadError`` when the server cannot be reached
    or refuses the key."""
    fallback = next(k for k, cls in LOADERS.items() if cls.identifying_route is None)
    async with httpx.AsyncClient(timeout=10.0, headers=auth_headers()) as http:
        for kind, cls in LOADERS.items():
            route = cls.identifying_route
            if route is None:
                continue
            try:
                resp = await http.get(plan.root + route)
            except httpx.HTTPError as exc:
                raise LoadError(
                    f"cannot reach the policy server at {plan.root} to load {plan.version!r}: "
                    f"{type(exc).__name__}: {redact(str(exc))} (fix: --policy-url)"
                ) from None
            if resp.status_code in (401, 403):
                raise key_refused(plan, route, resp)
            if resp.status_code == 200:
                return kind
    return fallback


def _weights_changed(plan: LoadPlan, reported: str) -> LoadError:
    """The error of a re-check after the run that found other weights served (``reported``:
    what the server reports now)."""
    return LoadError(
        f"the policy server's weights changed during the run of {plan.version!r}: "
        f"{reported}, not {plan.checkpoint}; records of this run may come from other weights "
        "(fix: run one weights version at a time per server: no other loader (trainer, second "
        "host) on it, then collect the version again into a fresh run directory)"
    )


def _json(resp: httpx.Response) -> dict[str, Any] | None:
    try:
        data = resp.json()
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _answer(resp: httpx.Response) -> str:
    """The server's words in a load answer: SGLang's ``error_message``/``message``, else the
    error envelopes :func:`~.wire.error_text` understands; redacted."""
    data = _json(resp)
    if data is not None:
        for key in ("error_message", "message"):
            if isinstance(data.get(key), str) and data[key]:
                return redact(data[key])[:1000]
    return error_text(resp.content) or f"(empty body, HTTP {resp.status_code})"


def _reported_path(answer: Any) -> str | None:
    """The path a weights route's JSON answer names (``model_path``, ``checkpoint``, ``path``)."""
    if not isinstance(answer, dict):
        return None
    return next(
        (answer[k] for k in ("model_path", "checkpoint", "path") if isinstance(answer.get(k), str)),
        None,
    )


def _not_found_route(resp: httpx.Response) -> bool:
    """A 404 for the route itself (FastAPI/Starlette's "Not Found"), not an answer of the route."""
    return error_text(resp.content).strip().strip('"') in ("Not Found", "")


def _same_dir(path: Any, checkpoint: str | None) -> bool:
    if not isinstance(path, str) or not checkpoint:
        return False
    return Path(path).parent == Path(checkpoint).parent


def _norm(path: str | None) -> str:
    return os.path.normpath(path or "")


def _resolved(path: str) -> str:
    return os.path.realpath(path)


def _fill(template: Any, plan: LoadPlan) -> Any:
    if isinstance(template, str):
        return template.replace("{checkpoint}", plan.checkpoint or "").replace(
            "{version}", plan.version
        )
    if isinstance(template, dict):
        return {k: _fill(v, plan) for k, v in template.items()}
    if isinstance(template, list):
        return [_fill(v, plan) for v in template]
    return template
