// The composer: sending a prompt (Enter sends, Shift+Enter breaks the line), cancelling
// the active run, and the run controls' state.

import { api } from "./api.js";
import { $, base, showError, state } from "./page.js";

/**
 * Wire the composer; returns `updateRunControls`, called whenever a run changes.
 * @param {object} page the parts (see main.js): transcript, sidebar, usage,
 *   ensureConversation, refreshConversation, attachments (the images sent with the
 *   message: attachments.js).
 * @returns {() => void}
 */
export function setupComposer(page) {
  const { transcript, sidebar, usage } = page;
  const prompt = $("prompt");
  const sendButton = $("send");
  const cancelButton = $("cancel-run");
  const runStatus = $("run-status");

  function updateRunControls() {
    const active = transcript.activeRun();
    cancelButton.hidden = !active;
    sendButton.disabled = Boolean(active) || state.sending;
    sendButton.title = active ? "The agent is still working: wait for it, or cancel it." : "";
    // A status region: screen readers hear "Working…", then how the run ended.
    const last = active || [...transcript.runs.values()].pop();
    runStatus.textContent = last ? last.statusEl.textContent : "";
  }

  async function send(event) {
    event.preventDefault();
    const text = prompt.value.trim();
    if (!text) {
      prompt.focus();
      return;
    }
    if (transcript.activeRun()) {
      showError("The agent is still working on your last message: wait for it, or cancel it.");
      return;
    }
    showError("");
    state.sending = true;
    updateRunControls();
    try {
      const id = await page.ensureConversation();
      if (page.datasources) await page.datasources.settled();
      const untitled = !state.conversation?.title;
      const body = { prompt: text };
      const attached = page.attachments ? page.attachments.paths() : [];
      if (attached.length) body.attachments = attached;
      const run = await api("POST", `/api/conversations/${id}/runs`, body);
      prompt.value = "";
      if (attached.length) page.attachments.clear();
      state.stickToBottom = true;
      const view = transcript.run(run.id);
      view.setPrompt(run.prompt);
      view.setAttachments(run.attachments);
      view.setStatus(run);
      usage.setRun({ input: 0, output: 0 });
      sidebar.note(id, { active: true });
      transcript.onChange();
      if (untitled) page.refreshConversation();
    } catch (error) {
      // Refused for its images: said where the images' warning is, not a second time here.
      if (error.code === "model_without_vision" && page.attachments) page.attachments.refused(error.message);
      else showError(error.message);
    } finally {
      state.sending = false;
      updateRunControls();
    }
  }

  $("composer").addEventListener("submit", send);
  prompt.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });

  cancelButton.addEventListener("click", async () => {
    const active = transcript.activeRun();
    if (!active) return;
    cancelButton.disabled = true;
    runStatus.textContent = "Cancelling…";
    try {
      await api("POST", `${base()}/runs/${active.runId}/cancel`);
    } catch (error) {
      if (error.code !== "run_finished") showError(error.message);
    } finally {
      cancelButton.disabled = false;
    }
  });

  return updateRunControls;
}
