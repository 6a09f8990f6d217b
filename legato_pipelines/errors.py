"""One exception hierarchy for the whole project (the httpx pattern: catch by meaning).

    LegatoError
    ├── ConfigError            bad input; the message names the field and the fix
    │   ├── TaskListError      a task list entry is invalid (names index, task_id, field)
    │   ├── ResumeError        --out holds a run of another policy version or task set
    │   ├── LoadError          a checkpoint could not be loaded into the model server, or the
    │   │                      server does not serve the version (quotes the server's answer)
    │   └── ModelFilesError    samples were made by another tokenizer, chat template or
    │                          processor than the one a trainer rebuilds their inputs with
    ├── PolicyError            a model call failed after its retries (record: error kind "policy")
    │   ├── PolicyTimeout      the hard per-call deadline (step_timeout) passed
    │   ├── ContextLengthError the prompt outgrew the context (record: status "truncated")
    │   ├── PolicyRequestError a 400 for what one request carries, after the batch's requests
    │   │                      had worked (record: error kind "request"; the batch goes on)
    │   └── PolicyConfigError  400/401/403/404: the batch cannot work; fail fast (also a ConfigError)
    │       └── ImageLimitError  "At most N image(s) ..." from vLLM
    └── DesktopError           a desktop failed (record: status "retried", or error kind "env")

No message ever contains the policy API key: it is read from ``LEGATO_POLICY_KEY`` only and
redacted from server messages before they are quoted.
"""

from __future__ import annotations

from typing import Any


class LegatoError(Exception):
    """Base class of every error legato-pipelines raises on purpose."""


class ConfigError(LegatoError, ValueError):
    """Bad input (a flag, a config field, a file). The message names the field and the fix."""


class ModelFilesError(ConfigError):
    """Samples cannot be rebuilt exactly with the processor given: their rows name other
    tokenizer / chat template / processor files (``legato_pipelines.model_files``), name none,
    or their prompt ids disagree with the screenshots' placeholders. The message names the
    column, both values and the fix."""


class TaskListError(ConfigError):
    """Entries of a task list are invalid. The message names each one's index, task_id (and
    the OSWorld file it came from) and field; ``problems`` holds every problem found, one
    line each (just the message when the error is about the list as a whole). ``tasks``:
    the entries that were valid all the same, as ``(index in the list, Task)`` pairs, so that
    a check can still report their own problems in the same run (``legato tasks check``)."""

    def __init__(
        self,
        message: str,
        problems: list[str] | tuple[str, ...] = (),
        what: str = "",
        tasks: Any = (),
    ):
        super().__init__(message)
        self.problems: tuple[str, ...] = tuple(problems) or (message,)
        self.what = what or "the task list"
        self.tasks: tuple[tuple[int, Any], ...] = tuple(tasks)

    @classmethod
    def listing(cls, problems: list[str], what: str, tasks: Any = ()) -> TaskListError:
        """One error for all ``problems`` of ``what`` (e.g. "the task list tasks.json"); its
        message is :meth:`describe` with the first 20. ``tasks``: the valid entries'
        ``(index, Task)`` pairs (class docstring)."""
        error = cls("", problems, what, tasks)
        error.args = (error.describe(20),)
        return error

    def describe(self, shown: int | None = None) -> str:
        """The problem itself when there is one, else a count and the first ``shown``
        problems (``None``: all), one a line."""
        if len(self.problems) == 1:
            return self.problems[0]
        shown = len(self.problems) if shown is None else shown
        lines = "\n  ".join(self.problems[:shown])
        rest = len(self.problems) - shown
        more = f"\n  ... and {rest} more (`legato tasks check` lists them all)" if rest > 0 else ""
        return f"{len(self.problems)} problems in {self.what}:\n  {lines}{more}"


class ResumeError(ConfigError):
    """The output directory already holds a run of another policy version or task set."""


class LoadError(ConfigError):
    """A policy version's checkpoint could not be put into the model server, or the server does
    not serve it (``legato_pipelines.policy.loading``). Raised before any desktop starts; the
    message quotes the server's answer and names the setting to change."""


class PolicyError(LegatoError):
    """A model call failed after ``retries`` re-tries (timeouts, connection errors, 429, 5xx).

    The attempt that made the call ends with status ``error`` and ``error.kind == "policy"``.
    ``attempts`` is how many HTTP requests were made for the call.
    """

    def __init__(self, message: str, *, attempts: int = 1, status_code: int | None = None):
        super().__init__(message)
        self.attempts = attempts
        self.status_code = status_code


class PolicyTimeout(PolicyError):
    """The hard per-call deadline (``step_timeout`` seconds) passed, on every try."""


class ContextLengthError(PolicyError):
    """The prompt plus ``max_tokens`` no longer fit the server's context (a 400 "maximum
    context length", vLLM / SGLang / OpenAI wording). Not a configuration error of the batch:
    the prompt grew with the attempt, so that attempt ends as ``truncated`` (reason recorded)
    and the batch goes on. Fix: lower ``--image-max`` or ``--max-tokens``, or raise the
    server's ``--max-model-len`` / ``--context-length``."""


class PolicyRequestError(PolicyError):
    """The server refused one request (HTTP 400) for what it carries (its prompt: an earlier
    answer of the attempt, a screenshot), not for the batch's settings: other requests of the
    batch, with the same settings, were answered. The attempt that made it ends with status
    ``error`` and ``error.kind == "request"`` (the server's words in the message); its desktop
    and the batch go on (issue 31)."""


class PolicyConfigError(PolicyError, ConfigError):
    """The server answered 400/401/403/404: a configuration problem, not a flaky call.

    Raised at once (no retries) so a wrong URL, model or option fails the batch in seconds
    instead of producing a batch of ``error`` records.
    """


class ImageLimitError(PolicyConfigError):
    """The server refused the number of images in one prompt (vLLM's "At most N image(s)").

    Fix: lower ``--image-max`` or raise the server's ``--limit-mm-per-prompt``.
    """

    def __init__(self, message: str, *, limit: int | None = None, **kwargs):
        super().__init__(message, **kwargs)
        self.limit = limit


class DesktopError(LegatoError):
    """A desktop failed: reset, setup, action, observation, crash, hung evaluator, transport.

    ``kind`` says which (``reset``, ``setup``, ``act``, ``observe``, ``crash``, ``evaluator``,
    ``vm``, ``transport``, ``timeout``; ``resource_limit``: a local desktop hit one of its
    resource caps, its message names which: ``pids``, ``memory`` or ``disk``). The engine records the attempt as ``retried`` and runs
    it again on a recovered desktop (up to ``env_retries``), else as ``error`` kind ``env``.
    """

    def __init__(self, message: str, *, kind: str = "desktop"):
        super().__init__(message)
        self.kind = kind
