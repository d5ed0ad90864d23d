// The sidebar: the person's conversations, newest activity first, each with a running
// indicator. Refreshed every few seconds while the page is visible (other conversations'
// runs are not on this page's socket) and at once when something here changes.

import { apiAll } from "./api.js";
import { el } from "./dom.js";

const REFRESH_SECONDS = 10;

export class Sidebar {
  constructor(list, emptyNote, currentId) {
    this.list = list;
    this.emptyNote = emptyNote;
    this.currentId = currentId;
    this.overrides = new Map(); // conversation id → {active, title} known from this page
    setInterval(() => {
      if (document.visibilityState === "visible") this.refresh();
    }, REFRESH_SECONDS * 1000);
  }

  async refresh() {
    let conversations;
    try {
      conversations = await apiAll("/api/conversations?page_size=100");
    } catch {
      return; // keep the list shown; the next refresh tries again
    }
    this.emptyNote.hidden = conversations.length > 0;
    this.list.replaceChildren(...conversations.map((c) => this.item(c)));
  }

  item(conversation) {
    const current = conversation.id === this.currentId();
    const known = (current && this.overrides.get(conversation.id)) || {};
    const running = known.active ?? Boolean(conversation.active_run_id);
    const title = known.title ?? (conversation.title || "New conversation");
    return el(
      "li",
      { dataset: { conversationId: conversation.id } },
      el(
        "a",
        { href: `/c/${conversation.id}/`, "aria-current": current ? "page" : null },
        running ? el("span", { class: "running-dot", title: "The agent is working", "aria-label": "running" }) : null,
        el("span", { class: "label" }, title),
      ),
    );
  }

  /** What this page knows first about the open conversation (its socket, a rename). */
  note(conversationId, facts) {
    this.overrides.set(conversationId, { ...(this.overrides.get(conversationId) || {}), ...facts });
    const link = this.list.querySelector(`li[data-conversation-id="${conversationId}"] a`);
    if (!link) {
      this.refresh();
      return;
    }
    if (facts.title !== undefined) link.querySelector(".label").textContent = facts.title || "New conversation";
    if (facts.active !== undefined) {
      link.querySelector(".running-dot")?.remove();
      if (facts.active) link.prepend(el("span", { class: "running-dot", title: "The agent is working", "aria-label": "running" }));
    }
  }
}
