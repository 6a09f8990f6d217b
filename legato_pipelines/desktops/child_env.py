"""What the processes the desktops run may inherit of this process's environment.

A desktop server (``desktops/server/main.py``) and every app, setup command and policy action
on its desktop run with the server's environment; an osworld worker (DesktopEnv) with its own.
None of them needs the policy API key, and only an osworld worker whose provider is a cloud
needs that cloud's credentials. So:

- desktop servers (:func:`desktop_server_env`): this process's environment without the
  policy key and without any credential (:func:`is_credential`);
- osworld workers (:func:`worker_env`): a short pass-list, plus
  exactly the variables of their ``provider`` (:data:`PROVIDER_ENV_PREFIXES`: ``AWS_*`` for
  ``aws``, ``AZURE_*`` for ``azure``...), which DesktopEnv's providers read to start and stop
  their VMs. A worker of provider ``local`` (the local backend's grader, or the osworld
  backend over a local desktop server) gets no credential at all.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from ..key_env import API_KEY_ENV

#: Never handed to a desktop server, its apps or a worker (the policy's API key).
POLICY_SECRET_ENV = (API_KEY_ENV,)

#: The variables each DesktopEnv provider reads (its credentials, region, network ids: the
#: names in desktop-env 1.0.2's ``providers/<name>``); a worker of that provider inherits them.
PROVIDER_ENV_PREFIXES: dict[str, tuple[str, ...]] = {
    "docker": ("DOCKER_", "KVM"),
    "aws": ("AWS_",),
    "azure": ("AZURE_",),
    "aliyun": ("ALIYUN_", "ALIBABA_CLOUD_"),
    "volcengine": ("VOLCENGINE_",),
    "vmware": (),
    "virtualbox": (),
    "local": (),
}

#: Credentials by prefix: cloud providers' SDK variables (AWS, Azure and Azure's Terraform
#: ``ARM_``, Google Cloud, Alibaba, Volcengine), model hubs and APIs.
CREDENTIAL_PREFIXES = (
    "AWS_",
    "AZURE_",
    "ARM_",
    "GOOGLE_",
    "GCLOUD_",
    "CLOUDSDK_",
    "ALIYUN_",
    "ALIBABA_CLOUD_",
    "VOLCENGINE_",
    "OPENAI_",
    "ANTHROPIC_",
)
#: Credentials by name, beyond :data:`CREDENTIAL_PATTERN` (an agent socket is one too).
CREDENTIAL_NAMES = frozenset({"SSH_AUTH_SOCK", "KUBECONFIG", "DOCKER_AUTH_CONFIG"})
#: Any other variable whose name says it holds a secret: ``HF_TOKEN``, ``GITHUB_TOKEN``,
#: ``*_SECRET*``, ``*_API_KEY``, ``*_ACCESS_KEY*``, ``*PASSWORD*``, ``*CREDENTIALS*``.
CREDENTIAL_PATTERN = re.compile(
    r"TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL", re.IGNORECASE
)


def is_credential(name: str) -> bool:
    """Whether the environment variable ``name`` holds (or points at) a credential: a cloud
    SDK's variable (:data:`CREDENTIAL_PREFIXES`), a known name, or a name matching
    :data:`CREDENTIAL_PATTERN`. The policy key is one too."""
    return (
        name in POLICY_SECRET_ENV
        or name.upper().startswith(CREDENTIAL_PREFIXES)
        or name in CREDENTIAL_NAMES
        or bool(CREDENTIAL_PATTERN.search(name))
    )


def desktop_server_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a desktop server process: ``base`` (default ``os.environ``) without
    the policy key and every credential (:func:`is_credential`). The server's own token is
    added by its starter afterwards (``LEGATO_DESKTOP_TOKEN``, never in argv)."""
    base = os.environ if base is None else base
    return {k: v for k, v in base.items() if not is_credential(k)}


def provider_env(provider: str | None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of ``base`` (default ``os.environ``) that DesktopEnv's ``provider`` reads
    (:data:`PROVIDER_ENV_PREFIXES`), its credentials included; none for ``None``, ``local``,
    ``vmware`` and ``virtualbox``."""
    base = os.environ if base is None else base
    prefixes = PROVIDER_ENV_PREFIXES.get(provider or "local", ())
    if not prefixes:
        return {}
    return {k: v for k, v in base.items() if k.startswith(prefixes) and k not in POLICY_SECRET_ENV}


#: Environment variables every osworld worker inherits (besides its provider's,
#: :func:`provider_env`): nothing else, so neither the policy key, another cloud's credentials
#: nor a stray configuration reaches DesktopEnv. ``HF_ENDPOINT``: a hub mirror for its
#: downloads.
PASS_ENV = (
    "HOME",
    "PATH",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HF_ENDPOINT",
)

#: One BLAS/OpenMP thread (numpy's OpenBLAS and OpenMP start a thread pool at import unless
#: told not to): a template process must have no thread but the one that forks (a lock held
#: by another thread at the fork would stay held in every child); both templates
#: (``server/template.py``, ``osworld_worker/template.py``) run with it.
SINGLE_THREADED = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def worker_env(extra: dict[str, str] | None = None, *, provider: str | None) -> dict[str, str]:
    """The clean environment of a worker: the parent's :data:`PASS_ENV`, the variables of its
    DesktopEnv ``provider`` (:func:`provider_env`: ``AWS_*`` for ``aws``, ``AZURE_*``
    for ``azure``, ...; nothing for ``local`` or ``None``, a worker that starts no VM), plus
    ``extra``. No other credential and never the policy key.

    ``PYTHON_DOTENV_DISABLED=1`` stops desktop_env's import-time ``load_dotenv()``
    (docs/osworld.md §8).
    """
    env = {k: v for k, v in os.environ.items() if k in PASS_ENV}
    env.update(provider_env(provider))
    env["PYTHON_DOTENV_DISABLED"] = "1"
    env.update(extra or {})
    return env
