"""Command-line options generated from a settings model (one option per field), so a
collection setting is declared once (:class:`~legato_pipelines.rollout.settings.CollectSettings`)
and ``legato collect`` gets its flag, default and help from it."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any, Literal, get_origin

import typer
from pydantic import BaseModel


def option_for(name: str, field: Any) -> inspect.Parameter:
    """The keyword parameter (``Annotated[type, typer.Option(...)] = default``) of one field:
    ``--max-steps`` for ``max_steps``; a switch gets ``--ready-signal/--no-ready-signal``; a
    ``Literal`` is taken as text (the model checks it: its description lists the choices)."""
    dashed = name.replace("_", "-")
    annotation = field.annotation
    if annotation is bool:
        decls = (f"--{dashed}/--no-{dashed}",)
    else:
        decls = (f"--{dashed}",)
        if get_origin(annotation) is Literal:  # typer has no Literal: the model checks the choice
            annotation = str
    info = typer.Option(*decls, help=field.description)
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=field.default,
        annotation=Annotated[annotation, info],
    )


def settings_options(
    model: type[BaseModel], *, after: str | None = None
) -> Callable[[Callable], Callable]:
    """Decorate a typer command whose signature ends in ``**settings``: that catch-all becomes
    one option per field of ``model`` (in field order; listed after the parameter ``after``,
    else last), and the command receives them in ``settings``."""

    def decorate(func: Callable) -> Callable:
        signature = inspect.signature(func, eval_str=True)
        generated = [option_for(n, f) for n, f in model.model_fields.items()]
        params: list[inspect.Parameter] = []
        for param in signature.parameters.values():
            if param.kind is not inspect.Parameter.VAR_KEYWORD:
                params.append(param.replace(kind=inspect.Parameter.KEYWORD_ONLY))
            if param.name == after or (param.kind is param.VAR_KEYWORD and after is None):
                params += generated
        func.__signature__ = signature.replace(parameters=params)
        func.__annotations__ = {p.name: p.annotation for p in params}
        if signature.return_annotation is not inspect.Signature.empty:
            func.__annotations__["return"] = signature.return_annotation
        return func

    return decorate
