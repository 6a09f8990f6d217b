"""Command-line options generated from a settings model (one option per field), so a setting
is declared once (:class:`~legato_pipelines.rollout.settings.CollectSettings`,
:class:`~legato_pipelines.policy.config.PolicyConfig`,
:class:`~legato_pipelines.policy.load_spec.LoadSpec`) and ``legato collect`` gets its flag,
default and help from it."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, get_origin

import typer
from pydantic import BaseModel

from ..setting_fields import exposure, user_settings


def option_for(name: str, field: Any) -> inspect.Parameter:
    """The keyword parameter (``Annotated[type, typer.Option(...)] = default``) of one field:
    ``--max-steps`` for ``max_steps``; a switch gets ``--ready-signal/--no-ready-signal``; a
    ``Literal`` is taken as text (the model checks it: its description lists the choices); a
    ``dict`` as JSON text (default: the field's default as JSON; the model parses it)."""
    dashed = name.replace("_", "-")
    annotation = field.annotation
    default = field.get_default(call_default_factory=True)
    if annotation is bool:
        decls = (f"--{dashed}/--no-{dashed}",)
    else:
        decls = (f"--{dashed}",)
        if get_origin(annotation) is Literal:  # typer has no Literal: the model checks the choice
            annotation = str
        elif annotation is dict or get_origin(annotation) is dict:
            annotation, default = str, json.dumps(default)
    info = typer.Option(*decls, help=field.description)
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=default,
        annotation=Annotated[annotation, info],
    )


def settings_options(
    model: type[BaseModel], *, after: str | None = None
) -> Callable[[Callable], Callable]:
    """Decorate a typer command whose signature ends in ``**settings``: that catch-all becomes
    one option per field of ``model`` (in field order; listed after the parameter ``after``,
    else last), and the command receives them in ``settings``. A model whose fields declare
    where users set them (:func:`~legato_pipelines.setting_fields.setting`) gets an option for
    each field marked for the command line, named by its user name (``--load-keep`` for
    ``LoadSpec.keep``: :func:`~legato_pipelines.setting_fields.from_user` maps them back);
    other models one per field. Stacked decorators share the one ``**settings``: the
    innermost takes its place, the others insert after ``after``."""

    def decorate(func: Callable) -> Callable:
        signature = inspect.signature(func, eval_str=True)
        declared = any(exposure(f) for f in model.model_fields.values())
        fields = (
            {user: f for user, (_, f) in user_settings(model, "cli").items()}
            if declared
            else dict(model.model_fields)
        )
        generated = [option_for(n, f) for n, f in fields.items()]
        params: list[inspect.Parameter] = []
        catch_all = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
        for param in signature.parameters.values():
            if param.kind is not inspect.Parameter.VAR_KEYWORD:
                params.append(param.replace(kind=inspect.Parameter.KEYWORD_ONLY))
            if param.name == after or (param.kind is param.VAR_KEYWORD and after is None):
                params += generated
        if after is None and not catch_all:
            params += generated
        func.__signature__ = signature.replace(parameters=params)
        func.__annotations__ = {p.name: p.annotation for p in params}
        if signature.return_annotation is not inspect.Signature.empty:
            func.__annotations__["return"] = signature.return_annotation
        return func

    return decorate


#: ``--osworld``: the OSWorld checkout that resolves ``{task_id, domain}`` entries (``legato
#: collect``, ``legato web record``).
OsworldCheckout = Annotated[
    Path | None,
    typer.Option("--osworld", help="OSWorld checkout to resolve {task_id, domain} entries."),
]
#: ``--desktop-option KEY=JSON`` (repeatable): the backend's options, checked by the
#: registry (``desktops/registry.py``) against the backend's options model.
DesktopOptionFlags = Annotated[
    list[str] | None,
    typer.Option("--desktop-option", help="Backend option KEY=JSON (repeatable)."),
]
