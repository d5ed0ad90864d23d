"""paw-agent: PAW's own agent runtime, the untrusted process inside each sandbox.

It speaks the serve protocol v1 (``PROTOCOL.md``, the wire format of the public
``python-agent-harness`` 1.5.6.6) on stdin/stdout and imports nothing from PAW or Django;
nothing in PAW imports it (import-linter contracts in ``pyproject.toml``) except
``sqlcheck``, the pure rule of a read, which the server reuses for knowledge examples.

Modules: ``cli`` (the ``paw-agent`` command), ``server`` (protocol ops, threads, signals),
``protocol`` (line writing), ``control`` (cancel and deadlines), ``agent`` (the run loop,
memory, context budget), ``model`` (model calls through the openai SDK), ``tools`` (the
tools and the approval gate), ``kernel`` / ``kernel_client`` (the persistent Python
subprocess), ``mpl_backend`` (figures saved as PNG), ``sql`` (datasources), ``sqlcheck`` (what is a read),
``workspace`` (path confinement), ``procs`` (process groups) and ``guard`` (no orphans).

Heavy imports (psycopg, sqlite3) happen on first use and the openai SDK's on a thread after
``ready`` (``--no-warm``: on first use too), so ``ready`` comes fast.
"""
