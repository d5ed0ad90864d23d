"""Images on a runtime that cannot send them: python-agent-harness has no ``images``
capability, so a run with attachments fails at once, saying so, instead of reaching the
model without its image."""

from __future__ import annotations

import pytest

from conversations.models import Run
from conversations.services.runs import run_start
from conversations.services.workspaces import workspace_ensure
from secrets_vault.models import CustomProvider
from secrets_vault.services import custom_provider_save
from tests.conftest import HARNESS
from tests.factories import ConversationFactory
from tests.images import png_bytes
from tests.live import wait_for
from tests.sandboxes.observe import finished

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_run_with_an_image_fails_clearly_on_a_runtime_without_images(worker_node, scripted_model):
    worker_node.use(HARNESS)
    custom_provider_save(
        provider=CustomProvider(
            name="eyes", base_url=scripted_model.base_url, known_models=["scripted-model"],
            vision=True,
        )
    )  # fmt: skip
    scripted_model.load({"fallback": "I never saw it."})
    scripted_model.clear_log()
    conversation = ConversationFactory()
    (workspace_ensure(conversation.id) / "photo.png").write_bytes(png_bytes())
    run = run_start(
        user=conversation.user,
        conversation_id=conversation.id,
        prompt="What is in photo.png?",
        llm_provider="eyes",
        attachments=["photo.png"],
    )
    run = wait_for(lambda: finished(run.id), timeout=90, what="the run to end")
    assert run.status == Run.Status.ERROR
    assert run.errors[0]["code"] == "runtime_unsupported"
    assert "cannot send images to the model" in run.errors[0]["message"]
    assert "photo.png" in run.errors[0]["message"]
    assert scripted_model.log == []
