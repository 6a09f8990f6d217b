"""The checkpoint-loading routes of the scripted policy server (:mod:`.scripted`): the routes
RL teams use to put a new policy version into a running server, as each flavor has them, and
which loaded weights answer a chat request. :mod:`legato_pipelines.policy.loading` is the
client side.

=========================  ==========================================================  ==========
route                      what it does here                                           flavors
=========================  ==========================================================  ==========
/v1/load_lora_adapter      ``{lora_name, lora_path}``: the folder (with                vllm,
/v1/unload_lora_adapter    ``adapter_config.json``) becomes model id ``lora_name``     vllm-old
                           (listed in ``/v1/models`` with ``root`` = path, ``parent``
                           = the base model); only when runtime LoRA updating is on
                           (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``, as vLLM), else 404
``weights_route``          vLLM has no full-weights route of its own; teams add one    vllm,
(e.g. /update_weights)     (prime-rl's ``/update_weights``). ``{"model_path": path}``  vllm-old
                           (key ``weights_key``) loads the folder (with
                           ``config.json``) as the base model's weights
/load_lora_adapter         SGLang's: ``{lora_name, lora_path}`` -> ``{success,          sglang
/unload_lora_adapter       error_message, loaded_adapters}``; the adapter is called
                           as model ``<base>:<lora_name>`` or with ``lora_path``
/update_weights_from_disk  ``{model_path}`` -> ``{success, message}``; the new path    sglang
/get_model_info            is reported as ``model_path`` by ``/get_model_info``
=========================  ==========================================================  ==========
"""

from __future__ import annotations

import os
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .scripted_config import Reject, RequestLog

RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
"""vLLM registers its runtime LoRA routes only when this variable is true ("1"/"true")."""


class LoadingRoutes:
    """The loading routes and the loaded weights of a :class:`~.scripted.ScriptedPolicyServer`
    (a mixin: the server holds the state: ``adapters``, ``weights``, ``weights_path``,
    ``loads``, the flavor and its switches, the request log and the prefix cache)."""

    def _loading_routes(self) -> list[Route]:
        """The load routes the server's flavor serves (module doc)."""
        if self.flavor.startswith("vllm"):
            routes = []
            if self.runtime_lora:
                routes += [
                    Route("/v1/load_lora_adapter", self._vllm_load_lora, methods=["POST"]),
                    Route("/v1/unload_lora_adapter", self._vllm_unload_lora, methods=["POST"]),
                ]
            if self.weights_route:
                routes.append(
                    Route(self.weights_route, self._vllm_weights_route, methods=["GET", "POST"])
                )
            return routes
        if self.flavor == "sglang":
            return [
                Route("/load_lora_adapter", self._sglang_load_lora, methods=["POST"]),
                Route("/unload_lora_adapter", self._sglang_unload_lora, methods=["POST"]),
                Route("/update_weights_from_disk", self._sglang_update_weights, methods=["POST"]),
                Route("/get_model_info", self._sglang_model_info, methods=["GET"]),
            ]
        return []

    def _new_generation(self) -> int:
        self._generation += 1
        return self._generation

    async def _load_request(self, request: Request, path: str) -> tuple[dict, Response | None]:
        """The JSON body of a load/unload request (logged), or an error response."""
        entry = RequestLog(seq=0, path=path)
        self.requests.append(entry)
        if (err := self._auth(request, entry)) is not None:
            return {}, err
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            body = None
            message = f"request body is not JSON: {exc}"
        else:
            message = "request body must be a JSON object"
        if not isinstance(body, dict):
            entry.status = 400
            return {}, self._error(Reject(400, message))
        entry.fields = tuple(body)
        return body, None

    @staticmethod
    def _text(text: str, status: int = 200) -> Response:
        return Response(orjson.dumps(text), status_code=status, media_type="application/json")

    async def _vllm_load_lora(self, request: Request) -> Response:
        body, err = await self._load_request(request, "/v1/load_lora_adapter")
        if err is not None:
            return err
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            return self._error(Reject(400, "Both 'lora_name' and 'lora_path' must be provided."))
        if name in self.adapters:
            return self._error(
                Reject(
                    400, f"The lora adapter '{name}' has already been loaded.", param="lora_name"
                )
            )
        if not os.path.isfile(os.path.join(path, "adapter_config.json")):
            return self._error(
                Reject(
                    404,
                    f"Loading lora {name} failed: No adapter found for {path}",
                    kind="NotFoundError",
                    param="lora_path",
                )
            )
        self.adapters[name] = path
        self._adapter_generation[name] = self._new_generation()
        self.loads.append(("/v1/load_lora_adapter", name, path))
        return self._text(f"Success: LoRA adapter '{name}' added successfully.")

    async def _vllm_unload_lora(self, request: Request) -> Response:
        body, err = await self._load_request(request, "/v1/unload_lora_adapter")
        if err is not None:
            return err
        name = body.get("lora_name")
        if name not in self.adapters:
            return self._error(
                Reject(
                    404,
                    f"The lora adapter '{name}' cannot be found.",
                    kind="NotFoundError",
                    param="lora_name",
                )
            )
        del self.adapters[name]
        return self._text(f"Success: LoRA adapter '{name}' removed successfully.")

    async def _vllm_weights_route(self, request: Request) -> Response:
        """``POST`` loads (below); ``GET`` answers ``{weights_key: the folder served}`` (how a
        team's route can tell what it loaded last; legato re-checks it after a run)."""
        if request.method == "GET":
            if (err := self._auth(request, RequestLog(seq=0, path=request.url.path))) is not None:
                return err
            return Response(
                orjson.dumps({self.weights_key: self.weights_path}), media_type="application/json"
            )
        return await self._vllm_load_weights(request)

    async def _vllm_load_weights(self, request: Request) -> Response:
        route = self.weights_route or ""
        body, err = await self._load_request(request, route)
        if err is not None:
            return err
        path = body.get(self.weights_key)
        if not isinstance(path, str) or not os.path.isfile(os.path.join(path, "config.json")):
            return self._error(
                Reject(400, f"cannot load weights from {path!r}: no config.json there")
            )
        self._set_weights(route, path)
        return Response(
            orjson.dumps({"status": "ok", self.weights_key: path}), media_type="application/json"
        )

    def _set_weights(self, route: str, path: str) -> None:
        self.weights = os.path.basename(os.path.normpath(path))
        self.weights_path = path
        self._weights_generation = self._new_generation()
        if self.flavor == "sglang":  # SGLang flushes its cache when it updates weights
            self.prefix_cache.clear()
        self.loads.append((route, self.weights, path))

    async def _sglang_load_lora(self, request: Request) -> Response:
        body, err = await self._load_request(request, "/load_lora_adapter")
        if err is not None:
            return err
        name, path = body.get("lora_name"), body.get("lora_path")
        error = None
        if not self.enable_lora:
            error = "LoRA is not enabled. Please set `--enable-lora` to True."
        elif not name or not path:
            error = "lora_name and lora_path are required"
        elif name in self.adapters:
            error = f"Failed to load LoRA adapter {name}: LoRA adapter {name} is already loaded."
        elif not os.path.isfile(os.path.join(path, "adapter_config.json")):
            error = f"Failed to load LoRA adapter {name}: no adapter_config.json in {path}"
        if error is None:
            self.adapters[name] = path
            self._adapter_generation[name] = self._new_generation()
            self.loads.append(("/load_lora_adapter", name, path))
        return self._sglang_answer(error, error_key="error_message", loaded=True)

    async def _sglang_unload_lora(self, request: Request) -> Response:
        body, err = await self._load_request(request, "/unload_lora_adapter")
        if err is not None:
            return err
        name = body.get("lora_name")
        error = None
        if not self.enable_lora:
            error = "LoRA is not enabled. Please set `--enable-lora` to True."
        elif name not in self.adapters:
            error = f"LoRA adapter {name} is not loaded."
        else:
            del self.adapters[name]
        return self._sglang_answer(error, error_key="error_message", loaded=True)

    async def _sglang_update_weights(self, request: Request) -> Response:
        body, err = await self._load_request(request, "/update_weights_from_disk")
        if err is not None:
            return err
        path = body.get("model_path")
        error = None
        if not isinstance(path, str) or not os.path.isfile(os.path.join(path, "config.json")):
            error = f"Failed to update weights: cannot load model from {path!r} (no config.json)."
        else:
            self._set_weights("/update_weights_from_disk", path)
        return self._sglang_answer(error, error_key="message")

    def _sglang_answer(
        self, error: str | None, *, error_key: str, loaded: bool = False
    ) -> Response:
        body: dict[str, Any] = {"success": error is None, error_key: error or ""}
        if error_key == "message" and error is None:
            body["message"] = "Succeeded to update model weights."
            body["num_paused_requests"] = 0
        if loaded:
            body["loaded_adapters"] = dict(self.adapters)
        return Response(
            orjson.dumps(body),
            status_code=200 if error is None else 400,
            media_type="application/json",
        )

    async def _sglang_model_info(self, request: Request) -> Response:
        entry = RequestLog(seq=0, path="/get_model_info")
        self.requests.append(entry)
        if (err := self._auth(request, entry)) is not None:  # SGLang's --api-key covers it
            return err
        return Response(
            orjson.dumps(
                {
                    "model_path": self.weights_path,
                    "tokenizer_path": self.model,
                    "is_generation": True,
                    "preferred_sampling_params": None,
                    "weight_version": "default",
                }
            ),
            media_type="application/json",
        )

    def _served(self, model: Any, req: dict[str, Any]) -> str | None:
        """The weights a chat request for ``model`` is answered by, or ``None`` when the model
        is not served. vLLM: the base model id or an adapter's name; SGLang: the base model id,
        ``<base>:<adapter>``, or the base with ``lora_path`` naming an adapter."""
        if model == self.model:
            lora = req.get("lora_path") if self.flavor == "sglang" else None
            if lora is None:
                return self.weights
            return lora if lora in self.adapters else None
        if not isinstance(model, str):
            return None
        if self.flavor.startswith("vllm") and model in self.adapters:
            return model
        if self.flavor == "sglang":
            base, sep, name = model.rpartition(":")
            if sep and base == self.model and name in self.adapters:
                return name
        return None
