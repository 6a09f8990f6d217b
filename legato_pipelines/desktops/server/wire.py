"""Names the desktop server and the processes that start or call it agree on."""

#: Environment variable holding a desktop server's token (never passed in argv).
DEFAULT_TOKEN_ENV = "LEGATO_DESKTOP_TOKEN"
#: First stdout line of a server once it is up: ``LEGATO_DESKTOP_READY {"url", "display", "pid", "home"}``.
READY_LINE = "LEGATO_DESKTOP_READY"
#: Sources of the ready wait (``POST /legato/wait`` field ``source``, the server's and
#: ``legato desktop serve``'s ``--ready-source``): the X server's DAMAGE reports, or frames polled.
READY_SOURCES = ("damage", "poll")
