// What calls the person back while the tab is hidden: the count of approvals waiting for
// them in the tab's title ("(2) PAW"), and a browser notification for each new one when
// they allowed notifications (asked only from the "Notify me" button, a user gesture).

const PREFIX = /^\(\d+\) /;

export class Attention {
  /** @param {HTMLButtonElement | null} notifyButton the "Notify me" control */
  constructor(notifyButton) {
    this.count = 0;
    this.seen = new Set(); // approval ids already announced
    this.primed = false; // the first list only records what is waiting, it announces nothing
    this.button = notifyButton;
    document.addEventListener("visibilitychange", () => this.applyTitle());
    // The page sets its own title (a rename, another conversation): keep the count on it.
    const title = document.querySelector("title");
    if (title) {
      new MutationObserver(() => this.applyTitle()).observe(title, { childList: true, characterData: true, subtree: true });
    }
    this.setUpButton();
  }

  setUpButton() {
    const button = this.button;
    if (!button) return;
    const supported = "Notification" in window;
    const refresh = () => {
      button.hidden = !supported || Notification.permission !== "default";
    };
    refresh();
    button.addEventListener("click", async () => {
      if (!supported) return;
      try {
        await Notification.requestPermission();
      } finally {
        refresh();
      }
    });
  }

  /**
   * The conversations' waiting approvals changed.
   * @param {Array<{id: string, title: string, pending_approvals: Array<{id: string}>}>} conversations
   */
  update(conversations) {
    let count = 0;
    for (const conversation of conversations) {
      for (const approval of conversation.pending_approvals || []) {
        count += 1;
        if (this.seen.has(approval.id)) continue;
        this.seen.add(approval.id);
        if (this.primed) this.announce(conversation, approval);
      }
    }
    this.primed = true;
    this.count = count;
    this.applyTitle();
  }

  announce(conversation, approval) {
    if (document.visibilityState === "visible") return;
    if (!("Notification" in window) || Notification.permission !== "granted") return;
    try {
      const notification = new Notification("PAW: waiting for you", {
        body: `${conversation.title || "New conversation"}: the agent needs your answer.`,
        tag: approval.id,
      });
      notification.addEventListener("click", () => {
        window.focus();
        location.assign(`/c/${conversation.id}/`);
      });
    } catch {
      // Some browsers only notify from a service worker: the title's count still shows it.
    }
  }

  applyTitle() {
    const base = document.title.replace(PREFIX, "");
    const shown = document.visibilityState === "hidden" && this.count > 0 ? `(${this.count}) ${base}` : base;
    if (shown !== document.title) document.title = shown; // the observer's call is then a no-op
  }
}
