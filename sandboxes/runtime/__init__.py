"""paw-agent: PAW's own agent runtime, run inside each sandbox (``paw-agent serve``).

Imports no Django and nothing else from PAW; nothing in PAW imports it (import-linter).
"""
