"""The operators' admin: the "stop the selected sandboxes" action stops live sandboxes on
the node that owns them."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from conversations.models import Run
from conversations.services.runs import run_start
from sandboxes.models import Sandbox
from tests.conftest import SCRIPTED_API_KEY
from tests.factories import ConversationFactory
from tests.live import wait_for
from tests.sandboxes.observe import finished, marked_processes, process_alive

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_the_admin_action_stops_the_selected_live_sandbox(celery_worker, scripted_model, make_user):
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "untooled": "Title", "fallback": "Hi."})
    stopped, untouched = ConversationFactory(), ConversationFactory()
    for conversation in (stopped, untouched):
        run = run_start(user=conversation.user, conversation_id=conversation.id, prompt="Hello")
        assert wait_for(lambda r=run: finished(r.id)).status == Run.Status.DONE
    sandbox = Sandbox.objects.get(conversation=stopped, state=Sandbox.State.READY)
    other = Sandbox.objects.get(conversation=untouched, state=Sandbox.State.READY)
    assert process_alive(sandbox.pid) and marked_processes(sandbox.id)
    operator = make_user("operator", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(operator)

    response = client.post(
        reverse("admin:sandboxes_sandbox_changelist"),
        {"action": "stop_sandboxes", "_selected_action": [str(sandbox.id)], "index": 0},
        follow=True,
    )

    assert response.status_code == 200
    assert "Asked 1 sandbox(es) to stop" in response.content.decode()
    wait_for(
        lambda: Sandbox.objects.get(id=sandbox.id).state == Sandbox.State.STOPPED,
        what="the sandbox to be stopped",
    )
    wait_for(lambda: not process_alive(sandbox.pid), what="its process to exit")
    assert marked_processes(sandbox.id) == []
    other.refresh_from_db()
    assert other.state == Sandbox.State.READY and process_alive(other.pid)


def test_the_worker_nodes_page_shows_each_nodes_sandbox_network(worker_node, make_user):
    """The node records the network its sandboxes get when it starts (PAW_SANDBOX_NETWORK:
    isolated under bubblewrap unless told host)."""
    from django.conf import settings

    from sandboxes.models import WorkerNode
    from tests.conftest import PAW_AGENT
    from tests.sandboxes.conftest import require_bubblewrap

    require_bubblewrap()
    operator = make_user("operator", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(operator)
    page = reverse("admin:sandboxes_workernode_changelist")
    for mode in ("host", "isolated"):
        worker_node.use(PAW_AGENT, PAW_SANDBOX_ISOLATION="bwrap", PAW_SANDBOX_NETWORK=mode)
        node = WorkerNode.objects.get(name=settings.PAW_NODE_NAME)
        assert node.sandbox_network == mode
        response = client.get(page)
        assert response.status_code == 200
        assert f'<td class="field-sandbox_network">{mode}</td>' in response.content.decode()
