"""The name of the environment variable holding the policy API key, in a module of its own.

:mod:`.policy.key` reads the key; :mod:`.desktops.child_env` keeps it out of every desktop
process's environment. The latter runs on ``legato``'s first line, before the policy package
(httpx, pydantic: ~0.3 s) is imported (:mod:`.desktops.early`), so the name lives here.
"""

API_KEY_ENV = "LEGATO_POLICY_KEY"
