// The conversation's websocket messages: what each one does to the page, and what the
// page checks again after a reconnect.

import { api, apiAll } from "./api.js";
import { $, base, showError, state } from "./page.js";

/**
 * The socket's handlers for the chat page.
 * @param {object} page the parts (see main.js): transcript, approvals, files, sidebar,
 *   usage, refreshConversation, updateRunControls.
 * @returns {{onMessage: (message: object) => void, onState: (state: string, detail?: string) => void}}
 */
export function messageHandlers(page) {
  const { transcript, approvals, files, sidebar, usage } = page;
  const transcriptEl = $("transcript");
  const connection = $("connection");
  let replayQuiet = null;
  let artifactsSoon = null;

  function refreshArtifactsSoon() {
    clearTimeout(artifactsSoon);
    artifactsSoon = setTimeout(() => files.refreshArtifacts().catch(() => {}), 300);
  }

  function onMessage(message) {
    switch (message.type) {
      case "run.event": {
        clearTimeout(replayQuiet);
        replayQuiet = setTimeout(() => transcriptEl.setAttribute("aria-busy", "false"), 400);
        transcript.handleEvent(message);
        const event = message.event || {};
        const view = transcript.runs.get(message.run_id);
        if (event.type === "notify" && event.kind === "usage" && view?.active) usage.setRun(event.data);
        if ((event.type === "notify" && event.kind === "tool") || event.type === "result") refreshArtifactsSoon();
        break;
      }
      case "run.status": {
        transcript.handleStatus(message);
        const view = transcript.runs.get(message.run_id);
        sidebar.note(state.conversationId, { active: Boolean(transcript.activeRun()) });
        if (view && !view.active) {
          showError(""); // e.g. "still working" no longer holds
          refreshArtifactsSoon();
          files.refreshFiles().catch(() => {});
          usage.refresh();
          if (view.usage) usage.setRun(view.usage);
        }
        break;
      }
      case "agent_confirm_request":
        approvals.show(message);
        transcript.noteApproval({ ...message, status: "pending" });
        break;
      case "agent_confirm_resolved":
        approvals.resolve(message);
        transcript.noteApproval(message);
        break;
      case "error":
        if (message.code === "approval_closed") reconcileApprovals();
        else showError(message.detail);
        break;
      default:
        break;
    }
  }

  function onState(socketState, detail) {
    connection.dataset.state = socketState;
    connection.textContent = {
      connecting: "Connecting…",
      connected: "Connected",
      reconnecting: "Reconnecting…",
      closed: detail || "Disconnected",
    }[socketState];
    connection.title = socketState === "reconnecting" && detail ? `Next try in ${detail} s` : "";
    if (socketState === "closed" && /signed out/.test(detail || "")) {
      location.assign(`/accounts/login/?next=${encodeURIComponent(location.pathname)}`);
    }
    if (socketState === "connected") setTimeout(reconcile, 1500);
  }

  /** After a reconnect: what may have ended while the socket was down. */
  async function reconcile() {
    await reconcileApprovals();
    const conversation = await page.refreshConversation();
    if (!conversation) return;
    for (const view of transcript.runs.values()) {
      if (view.active && view.runId !== conversation.active_run_id) {
        try {
          transcript.handleStatus({ ...(await api("GET", `${base()}/runs/${view.runId}`)), run_id: view.runId });
        } catch {
          // the next reconnect tries again
        }
      }
    }
    page.updateRunControls();
  }

  async function reconcileApprovals() {
    if (!state.conversationId) return;
    try {
      const pending = await apiAll(`${base()}/approvals?status=pending&page_size=100`);
      approvals.keepOnly(new Set(pending.map((approval) => approval.id)));
      const all = await apiAll(`${base()}/approvals?page_size=100`);
      transcript.seedApprovals(all);
    } catch {
      // shown again on the next connect
    }
  }

  return { onMessage, onState };
}
