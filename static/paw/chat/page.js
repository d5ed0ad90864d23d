// What every part of the chat page shares: its configuration, its state and two small
// helpers (the composer's error line and the conversation's title).

export const config = JSON.parse(document.getElementById("paw-config").textContent);
export const $ = (id) => document.getElementById(id);

export const state = {
  conversationId: config.conversationId,
  conversation: null,
  creating: null,
  socket: null,
  sending: false,
  pendingChoice: { llm_provider: "", llm_model: "" },
  stickToBottom: true,
};

/** The REST URL of the open conversation. */
export const base = () => `/api/conversations/${state.conversationId}`;

/** Show `text` under the composer (nothing: hide the line). */
export function showError(text) {
  const line = $("composer-error");
  line.textContent = text || "";
  line.hidden = !text;
}

/** Show the conversation's title in the header and the tab. */
export function showTitle(title) {
  const shown = title || "New conversation";
  $("conversation-title").textContent = shown;
  document.title = `${shown} · PAW`;
}
