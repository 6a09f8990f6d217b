"""The ``osworld`` backend: OSWorld's DesktopEnv in a worker process under its own interpreter.

``backend.py`` (project side, asyncio) drives ``worker.py`` (OSWorld side: stdlib and
``desktop_env`` only) over JSON lines; ``provider_local.py`` is the worker-side provider whose
"VM" is a project local desktop server; ``install.py`` builds the OSWorld interpreter.
"""
