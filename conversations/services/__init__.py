"""Writes for conversations, split by concern (one module each):

- ``conversations``: create, update, delete conversations
- ``files``: uploads into the workspace
- ``runs``: start, cancel and finish runs
- ``events``: the event log (cursor allocation, append, fan-out)
- ``approvals``: decisions on the agent's questions and confirms

Import from the module, e.g. ``from conversations.services.runs import run_start``.
"""
