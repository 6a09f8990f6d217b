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

Errors are :class:`~legato_pipelines.errors.LoadError` (a ``ConfigError``) quoting the
server's answer, or saying what is wrong with the folder, and naming the setting to change. The API key (``LEGATO_POLICY_KEY``) is sent as a bearer token and never
appears in a message, a proof or a record.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import ConfigError, LoadError
from .config import PolicyConfig, policy_api_key
from .servers import POLL_S, ServerState, release_path
from .wire import error_text, redact

LoadMode = Literal["none", "lora", "weights", "external"]
LOAD_MODES: tuple[str, ...] = ("none", "lora", "weights", "external")
ServerKind = Literal["auto", "vllm", "sglang"]

FINGERPRINT_FILES = (
    "config.json",
    "adapter_config.json",
    "generation_config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.json",
    "chat_template.jinja",
    "preprocessor_config.json",
)
"""Small files hashed whole by :func:`fingerprint` (plus every ``*.index.json``)."""
HASH_LIMIT = 4 << 20
"""[bytes] config and index files up to this size are hashed whole (larger ones: size only)."""
PARTIAL_SUFFIXES = (".tmp", ".partial", ".incomplete", ".lock")
TEMPORARY_NAME = re.compile(r"\.(tmp|temp|partial|incomplete|lock)[\w-]*$", re.IGNORECASE)
"""A folder name a trainer writes under before renaming it into place (``step-5.tmp``,
``step-6.partial``, ``step-7.tmp-1234``): never a version."""


class LoadSpec(BaseModel):
    """How a policy version reaches the model server (module doc). Fields:

    mode            ``none`` | ``lora`` | ``weights`` | ``external`` (``--load``)
    checkpoint      the version's checkpoint folder (``--checkpoint``); needed by ``lora`` and
                    ``weights``, fingerprinted whenever given
    server          ``auto`` (SGLang when ``GET /get_model_info`` answers, else vLLM) |
                    ``vllm`` | ``sglang`` (``--load-server``)
    adapter         the adapter / served name of the version (default: the version)
    keep            [adapters] LoRA adapters from the same checkpoints directory kept loaded,
                    the new one included (``--load-keep``)
    weights_route   vLLM full-weights route (``--weights-route``)
    weights_payload its JSON body; strings ``{checkpoint}`` / ``{version}`` are filled in
                    (``--weights-payload``)
    timeout         [s] per load / unload request (loading weights takes minutes;
                    ``--load-timeout``)
    wait            [s] how long a ``weights`` run waits for another run of this host that
                    holds the server's weights (:mod:`.servers`; ``--load-wait``)
    """

    model_config = ConfigDict(extra="forbid")

    mode: LoadMode = "none"
    checkpoint: str | None = None
    server: ServerKind = "auto"
    adapter: str | None = None
    keep: int = Field(2, ge=1)
    weights_route: str = "/update_weights"
    weights_payload: dict[str, Any] = Field(default_factory=lambda: {"model_path": "{checkpoint}"})
    timeout: float = Field(600.0, gt=0)
    wait: float = Field(3600.0, ge=0)

    @field_validator("weights_route")
    @classmethod
    def _route(cls, value: str) -> str:
        if "://" in value:
            raise ValueError(
                "must be a path on the policy server (e.g. /update_weights), not a URL: the "
                "server is the one --policy-url names"
            )
        if not value.startswith("/"):
            raise ValueError("must be a path starting with '/' (e.g. /update_weights)")
        return value

    @classmethod
    def checked(cls, **values: Any) -> LoadSpec:
        """The spec from keyword values; raises ``ConfigError`` naming the field and its flag."""
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            first = exc.errors()[0]
            name = str(first["loc"][0]) if first["loc"] else "load"
            flag = _FLAGS.get(name, f"--{name.replace('_', '-')}")
            raise ConfigError(
                f"load.{name}: {first['msg']}, got {first.get('input')!r} (fix: {flag})"
            ) from None


_FLAGS = {
    "mode": "--load",
    "server": "--load-server",
    "keep": "--load-keep",
    "timeout": "--load-timeout",
    "wait": "--load-wait",
}


# -- fingerprint ------------------------------------------------------------------------------


def fingerprint(folder: str | Path) -> dict[str, Any]:
    """A cheap identity of a checkpoint folder: every file's size (recursively, names relative
    to the folder); the SHA-256 of its config and index files (:data:`FINGERPRINT_FILES`,
    ``*.index.json``; at most :data:`HASH_LIMIT` bytes each); and for every other file (weight
    shards, adapter weights) a content sample: the SHA-256 of its first and last
    :data:`SAMPLE_BYTES` (the whole file when it is smaller than two samples).

    The sample tells one training step from the next although sizes and configs are the same
    (a safetensors file's tail is tensor data) and does not depend on modification times,
    which a copy changes. Cost: one open, two reads of 64 KiB and a seek per file, whatever its
    size (about a millisecond per shard from the page cache, a few disk seeks cold; measured
    in docs/wire-formats.md §5).

    Returns ``{"digest": "sha256:<64 hex>", "files": {name: {"size": bytes, "sha256" | "sample":
    hex}}}``; the digest covers the whole listing, so a rewritten shard, a new or missing file,
    or an edited config changes it. Raises ``LoadError`` when ``folder`` is not a directory.
    """
    root = Path(folder)
    if not root.is_dir():
        raise LoadError(
            f"checkpoint {str(folder)!r} is not a directory (fix: --checkpoint the version's folder)"
        )
    files: dict[str, dict[str, Any]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            try:
                size = path.stat().st_size
                entry: dict[str, Any] = {"size": size}
                if name in FINGERPRINT_FILES or name.endswith(".index.json"):
                    if size <= HASH_LIMIT:
                        entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
                else:
                    entry["sample"] = _sample(path, size)
            except OSError:  # removed while listing
                continue
            files[rel] = entry
    return {"digest": _digest(files), "files": files}


SAMPLE_BYTES = 64 << 10
"""[bytes] read from each end of a weight file by :func:`fingerprint`."""


def _sample(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        if size <= 2 * SAMPLE_BYTES:
            digest.update(fh.read())
        else:
            digest.update(fh.read(SAMPLE_BYTES))
            fh.seek(size - SAMPLE_BYTES)
            digest.update(fh.read(SAMPLE_BYTES))
    return digest.hexdigest()


def _digest(files: dict[str, dict[str, Any]]) -> str:
    return "sha256:" + hashlib.sha256(orjson.dumps(files, option=orjson.OPT_SORT_KEYS)).hexdigest()


def same_fingerprint(recorded: dict[str, Any], now: dict[str, Any]) -> bool:
    """Whether ``now`` (a ``run.json`` ``checkpoint`` entry of this version) has the folder
    ``recorded`` had. A ``recorded`` entry written before content samples existed (its
    ``files`` have sizes and config hashes only) is compared on what it recorded."""
    old, new = recorded.get("fingerprint"), now.get("fingerprint")
    if old == new:
        return True
    old_files, new_files = recorded.get("files"), now.get("files")
    if not isinstance(old_files, dict) or not isinstance(new_files, dict) or old is None:
        return False
    if any(isinstance(e, dict) and "sample" in e for e in old_files.values()):
        return False
    legacy = {
        name: {k: v for k, v in entry.items() if k != "sample"} for name, entry in new_files.items()
    }
    return _digest(legacy) == old


def incomplete(folder: str | Path, mode: str | None = None) -> str | None:
    """Why a checkpoint folder is not complete yet, or ``None`` when it looks complete: a file
    still being written (``*.tmp``, ``*.partial``, ``*.incomplete``, ``*.lock``); an
    ``*.index.json`` naming shards that are not there (its ``weight_map``); shards named
    ``*-0000i-of-0000n.*`` without their index (it is written after them) or with some of the
    ``n`` missing; ``adapter_config.json`` without adapter weights; ``config.json`` without any
    weights file (``*.safetensors``, ``*.bin``, ``*.pt``, ``*.pth``) or index. An empty folder
    counts as complete (some trainers signal a version with an empty folder, and ``load none``
    needs nothing in it). With a load ``mode`` the folder must also hold what that mode loads:
    ``lora`` ``adapter_config.json`` and adapter weights (PEFT writes the weights first),
    ``weights`` ``config.json`` and weights; an empty folder is then not complete. A few
    ``stat`` calls and the index files read: cheap enough for a sensor tick."""
    root = Path(folder)
    try:
        names = sorted(os.listdir(root))
    except OSError as exc:
        return f"cannot be listed ({exc.strerror or exc})"
    partial = [n for n in names if n.endswith(PARTIAL_SUFFIXES)]
    if partial:
        return f"still being written ({', '.join(partial[:3])})"
    indexes = [n for n in names if n.endswith(".index.json")]
    for name in indexes:
        try:
            index = orjson.loads((root / name).read_bytes())
            shards = set((index.get("weight_map") or {}).values())
        except (OSError, orjson.JSONDecodeError, AttributeError):
            return f"{name} is not readable JSON yet"
        missing = sorted(s for s in shards if not (root / s).is_file())
        if missing:
            return f"{name} names {len(missing)} missing shard(s), e.g. {missing[0]}"
    sharded: dict[tuple[str, str, int], set[int]] = {}
    for name in names:
        if match := _SHARD.match(name):
            key = (match["stem"], match["ext"], int(match["total"]))
            sharded.setdefault(key, set()).add(int(match["i"]))
    for (stem, ext, total), present in sorted(sharded.items()):
        if not indexes:
            return f"{stem}-*-of-{total:05d}.{ext} shards without their index file yet"
        if len(present) < total:
            return f"{len(present)} of {total} {stem}-*.{ext} shards present"
    if mode == "lora" and "adapter_config.json" not in names:
        return "no adapter_config.json yet (load lora needs it beside the adapter weights)"
    if mode == "weights" and "config.json" not in names:
        return "no config.json yet (load weights needs it beside the weights)"
    if "adapter_config.json" in names and not any(n.startswith("adapter_model") for n in names):
        return "adapter_config.json without adapter_model.* weights"
    if "config.json" in names and not indexes and not any(n.endswith(_WEIGHTS) for n in names):
        return "config.json without model weights yet (no *.safetensors, *.bin or index)"
    return None


_SHARD = re.compile(r"^(?P<stem>.+)-(?P<i>\d{5})-of-(?P<total>\d{5})\.(?P<ext>safetensors|bin)$")
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth")


# -- loading ----------------------------------------------------------------------------------


@dataclass
class LoadPlan:
    """What :func:`plan_load` decided, before anything changes on the server: the mode, the
    server kind, the model id the batch will call (``model``), the checkpoint folder and its
    fingerprint."""

    spec: LoadSpec
    version: str
    server: Literal["vllm", "sglang"] | None
    model: str
    base_model: str
    checkpoint: str | None
    fingerprint: dict[str, Any] | None
    root: str = ""
    proof: dict[str, Any] = field(default_factory=dict)
    state: ServerState | None = None
    held: list[Any] = field(default_factory=list)  # the weights lock and adapter leases

    @property
    def adapter(self) -> str:
        """The adapter / served name of the version (``spec.adapter``, else the version)."""
        return self.spec.adapter or self.version

    @property
    def cache_salt(self) -> str | None:
        """The ``cache_salt`` every request of the batch carries: ``legato-`` and 32 hex digits
        of the checkpoint's fingerprint (``None`` without a checkpoint). vLLM keys an adapter's
        prefix cache by its name and path, not its weights: an adapter reloaded under the same
        name from a rewritten folder would be answered with KV computed by the old weights
        (issue 31: 1,664 of 1,743 prompt tokens). Requests share cached blocks only with
        requests of the same salt, so new weights never reuse the old ones' KV, and runs of
        the same weights still share theirs."""
        digest = (self.fingerprint or {}).get("digest")
        if not digest:
            return None
        return "legato-" + digest.removeprefix("sha256:")[:32]

    @property
    def listed_model(self) -> str:
        """The id ``/v1/models`` must list for the batch's calls to work: the called model,
        except SGLang adapters (called ``<base>:<adapter>``, the base is what it lists)."""
        if self.server == "sglang" and self.spec.mode == "lora":
            return self.base_model
        return self.model

    def meta(self) -> dict[str, Any]:
        """``run.json``'s ``checkpoint`` entry: mode, server, served model, folder, fingerprint
        (digest and files), the ``cache_salt`` every request carries (derived from the
        fingerprint: the proof's other half, no request answered from cache of other weights)
        and the proof once :func:`load_version` has run."""
        out: dict[str, Any] = {
            "load": self.spec.mode,
            "server": self.server,
            "served_model": self.model,
            "path": self.checkpoint,
            "fingerprint": (self.fingerprint or {}).get("digest"),
        }
        if self.cache_salt:
            out["cache_salt"] = self.cache_salt
        if self.fingerprint:
            out["files"] = self.fingerprint["files"]
        if self.proof:
            out["proof"] = self.proof
        return out


def _root(policy: PolicyConfig) -> str:
    base = policy.base_url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def _headers() -> dict[str, str]:
    key = policy_api_key()
    return {"Authorization": f"Bearer {key}"} if key else {}


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
        root=_root(policy),
    )
    if spec.mode == "none":
        return plan
    plan.server = spec.server if spec.server != "auto" else await _detect(plan)
    if spec.mode == "lora":
        plan.model = plan.adapter if plan.server == "vllm" else f"{policy.model}:{plan.adapter}"
    elif spec.mode == "external":  # read-only: verified now, so the model id is known
        async with httpx.AsyncClient(timeout=30.0, headers=_headers()) as http:
            await _Loader(plan, http).external()
    return plan


async def _detect(plan: LoadPlan) -> Literal["vllm", "sglang"]:
    async with httpx.AsyncClient(timeout=10.0, headers=_headers()) as http:
        try:
            resp = await http.get(plan.root + "/get_model_info")
        except httpx.HTTPError as exc:
            raise LoadError(
                f"cannot reach the policy server at {plan.root} to load {plan.version!r}: "
                f"{type(exc).__name__}: {redact(str(exc))} (fix: --policy-url)"
            ) from None
    if resp.status_code in (401, 403):
        raise _key_refused(plan, "/get_model_info", resp)
    return "sglang" if resp.status_code == 200 else "vllm"


def _key_refused(plan: LoadPlan, route: str, resp: httpx.Response) -> LoadError:
    """A 401/403 from a load route or ``/v1/models``: the key is wrong or missing (the key
    itself is never quoted)."""
    sent = "a key" if policy_api_key() else "no key"
    return LoadError(
        f"the policy server at {plan.root} refused {route} (HTTP {resp.status_code}: "
        f"{_answer(resp)}) while loading {plan.version!r}; {sent} was sent (fix: set "
        "LEGATO_POLICY_KEY to the server's API key, e.g. vLLM's / SGLang's --api-key)"
    )


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
    async with httpx.AsyncClient(timeout=plan.spec.timeout, headers=_headers()) as http:
        loader = _Loader(plan, http)
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
    async with httpx.AsyncClient(timeout=30.0, headers=_headers()) as http:
        loader = _Loader(plan, http)
        if kind == "model_path":
            reported = await loader.reported_model_path()
            if reported is not None and _norm(reported) != _norm(plan.checkpoint):
                raise LoadError(
                    f"the policy server's weights changed during the run of {plan.version!r}: "
                    f"/get_model_info reports model_path {reported!r}, not {plan.checkpoint}; "
                    "records of this run may come from other weights (fix: run one weights "
                    "version at a time per server: no other loader (trainer, second host) on "
                    "it, then collect the version again into a fresh run directory)"
                )
            return {"checked": True, "detail": f"/get_model_info model_path = {reported!r}"}
        if kind == "models_listing":
            listed = {m["id"]: m for m in await loader.models()}
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
        if kind == "route_reported_path":
            route = plan.spec.weights_route
            reported = _reported_path(await loader.get_json(route))
            if reported is not None and _norm(reported) != _norm(plan.checkpoint):
                raise LoadError(
                    f"the policy server's weights changed during the run of {plan.version!r}: "
                    f"GET {route} reports {reported!r}, not {plan.checkpoint}; records of this "
                    "run may come from other weights (fix: run one weights version at a time "
                    "per server: no other loader (trainer, second host) on it, then collect "
                    "the version again into a fresh run directory)"
                )
            if reported is not None:
                return {"checked": True, "detail": f"GET {route} reports {reported!r}"}
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
    sglang_adapter = plan.spec.mode == "lora" and plan.server == "sglang"
    if plan.spec.mode not in ("lora", "external") or (
        plan.listed_model == plan.base_model and not sglang_adapter
    ):
        return None
    try:
        async with httpx.AsyncClient(timeout=10.0, headers=_headers()) as http:
            listed = {m["id"] for m in await _Loader(plan, http).models()}
    except LoadError:
        return None
    if plan.listed_model in listed and not sglang_adapter:
        return None
    if sglang_adapter and plan.base_model not in listed:
        return None
    return (
        f"adapter {plan.adapter!r} (model {plan.model!r}) was unloaded from the policy server "
        f"while this run of {plan.version!r} called it, most likely by another run keeping only "
        f"its newest adapters (fix: LEGATO_POLICY_LOAD_KEEP / --load-keep at least the number "
        "of versions collected at once, plus one; then resume this run)"
    )


class _Loader:
    def __init__(self, plan: LoadPlan, http: httpx.AsyncClient):
        self.plan = plan
        self.http = http

    async def post(self, route: str, body: dict[str, Any]) -> httpx.Response:
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

    async def reported_model_path(self) -> str | None:
        """The ``model_path`` SGLang's ``GET /get_model_info`` reports (``None`` when the server
        reports none); raises ``LoadError`` on a 401/403 (the key)."""
        info = await self.get_json("/get_model_info")
        return info.get("model_path") if isinstance(info, dict) else None

    async def get_json(self, route: str) -> Any:
        """The JSON a ``GET`` answers, ``None`` when there is none; raises ``LoadError`` on a
        401/403 (the key)."""
        try:
            resp = await self.http.get(self.plan.root + route, timeout=30.0)
        except httpx.HTTPError:
            return None
        if resp.status_code in (401, 403):
            raise _key_refused(self.plan, route, resp)
        if resp.status_code != 200:
            return None
        try:
            return resp.json()
        except ValueError:
            return None

    def refused(self, route: str, resp: httpx.Response, fix: str) -> LoadError:
        if resp.status_code in (401, 403):
            return _key_refused(self.plan, route, resp)
        if resp.status_code == 404 and _not_found_route(resp):
            other = "sglang" if self.plan.server == "vllm" else "vllm"
            how = "as set" if self.plan.spec.server != "auto" else "as detected"
            fix += (
                f"; or --load-server {other} if this is a {other} server (taken for "
                f"{self.plan.server} {how})"
            )
        return LoadError(
            f"the policy server refused to load {self.plan.version!r} from {self.plan.checkpoint}: "
            f"{route} answered HTTP {resp.status_code}: {_answer(resp)} (fix: {fix})"
        )

    async def models(self) -> list[dict[str, Any]]:
        data = await self.get_json("/v1/models")
        items = (data or {}).get("data") if isinstance(data, dict) else None
        return [m for m in items or [] if isinstance(m, dict) and "id" in m]

    # -- lora --------------------------------------------------------------------------------

    async def lora(self) -> None:
        plan = self.plan
        if plan.server == "vllm":
            await self.vllm_lora()
        else:
            await self.sglang_lora()

    async def vllm_lora(self) -> None:
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

    async def sglang_lora(self) -> None:
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
        if self.plan.state is not None:
            self.plan.state.remember(
                self.plan.adapter, self.plan.checkpoint, (self.plan.fingerprint or {}).get("digest")
            )

    # -- weights ----------------------------------------------------------------------------

    async def weights(self) -> None:
        plan = self.plan
        if plan.server == "sglang":
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
            return
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

    # -- external ---------------------------------------------------------------------------

    async def external(self) -> None:
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
        if plan.server == "sglang" and plan.checkpoint:
            reported = await self.reported_model_path()
            if reported is not None and _resolved(reported) == _resolved(plan.checkpoint):
                plan.model = plan.base_model
                plan.proof = {
                    "kind": "model_path",
                    "detail": f"/get_model_info model_path = {reported!r}",
                }
                return
        raise LoadError(
            f"load 'external': the policy server does not serve version {plan.version!r}: "
            f"/v1/models lists {', '.join(sorted(listed)) or 'nothing'}"
            + (
                ", and /get_model_info reports another model_path"
                if plan.server == "sglang"
                else ""
            )
            + "; nothing was collected (fix: have the trainer load the checkpoint as adapter "
            f"{name!r} before the run, --load lora / weights to load it from here, or "
            "--load none to collect without proof)"
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
