// The conversation's settings and dialogs: auto-approve, new, rename, delete (the
// conversation list's drawer on narrow screens is drawer.js).

import { api } from "./api.js";
import { confirmAction } from "./dom.js";
import { $, base, showError, showTitle, state } from "./page.js";

/**
 * Wire the header's controls.
 * @param {object} page the parts (see main.js): sidebar, ensureConversation.
 */
export function setupDialogs(page) {
  const { sidebar } = page;

  $("auto-approve").addEventListener("change", async (event) => {
    const wanted = event.target.checked;
    try {
      if (!state.conversationId) {
        await page.ensureConversation(); // created with the box's value
        return;
      }
      state.conversation = await api("PATCH", base(), { auto_approve: wanted });
    } catch (error) {
      event.target.checked = !wanted;
      showError(error.message);
    }
  });

  // A new conversation starts as a blank page: the first message or upload creates it, so
  // clicking twice leaves no empty conversations behind.
  $("new-conversation").addEventListener("click", () => {
    if (state.conversationId) location.assign("/");
    else $("prompt").focus();
  });

  $("rename-conversation").addEventListener("click", () => {
    $("rename-input").value = state.conversation?.title || "";
    $("rename-dialog").showModal();
  });
  $("rename-cancel").addEventListener("click", () => $("rename-dialog").close("cancel"));
  $("rename-dialog").addEventListener("close", async () => {
    if ($("rename-dialog").returnValue !== "ok") return;
    try {
      state.conversation = await api("PATCH", base(), { title: $("rename-input").value.trim() });
      showTitle(state.conversation.title);
      sidebar.note(state.conversationId, { title: state.conversation.title });
    } catch (error) {
      showError(error.message);
    }
  });

  $("forget-memory").addEventListener("click", async () => {
    const sure = await confirmAction({
      title: "Forget the agent's memory?",
      text: "The agent starts afresh: it no longer remembers the earlier messages of this conversation. They stay on this page, and your files stay too.",
      ok: "Forget",
      cancel: "Keep it",
    });
    if (!sure) return;
    try {
      await api("DELETE", `${base()}/session`);
      showError("");
      page.transcript.conversationNotice("The agent forgot the earlier messages: the next one starts afresh.");
      page.transcript.onChange();
    } catch (error) {
      showError(error.code === "run_active" ? "The agent is still working: wait for it, or cancel it, then forget." : error.message);
    }
  });

  $("delete-conversation").addEventListener("click", async () => {
    const sure = await confirmAction({
      title: "Delete this conversation?",
      text: "Its messages, its files and everything the agent made are deleted for good.",
      ok: "Delete",
      cancel: "Keep it",
    });
    if (!sure) return;
    try {
      await api("DELETE", base());
      location.assign("/");
    } catch (error) {
      showError(error.message);
    }
  });
}
