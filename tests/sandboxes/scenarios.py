"""What the sandbox tests make runtimes do: the deliberately misbehaving fake runtime
(``fake_runtime.py``, its command and how to pick its mode) and slow streams for the
scripted model (long enough to cancel, stop or kill a run in the middle)."""

from __future__ import annotations

from conversations.services.runs import run_start
from conversations.services.workspaces import workspace_ensure
from tests.factories import ConversationFactory
from tests.processes import PYTHON, ROOT

#: ``PAW_HARNESS_CMD`` of the fake runtime (run it without bubblewrap: it is not installed).
FAKE = f"{PYTHON} {ROOT / 'tests' / 'sandboxes' / 'fake_runtime.py'} serve"

#: About 10 s of deltas.
SLOW = {"text": "x" * 400, "chunk": 2, "chunk_delay": 0.05}
#: About 100 s of deltas, unless cancelled.
STORY = {"text": "s" * 4000, "chunk": 2, "chunk_delay": 0.05}


def start_with_mode(mode: str, prompt: str = "go"):
    """A new conversation whose fake runtime runs in ``mode`` (see ``fake_runtime.py``),
    and a run of ``prompt`` started in it: ``(conversation, run)``."""
    conversation = ConversationFactory()
    (workspace_ensure(conversation.id) / "fake_mode").write_text(mode)
    run = run_start(user=conversation.user, conversation_id=conversation.id, prompt=prompt)
    return conversation, run
