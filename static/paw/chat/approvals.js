// The panel for what the agent waits on: a confirm (Approve / Decline) or questions
// (options as buttons, plus free text), each with a countdown to its deadline. A panel
// closes when the approval is resolved anywhere: this tab, another tab, the API, the
// deadline (the server then declines a confirm and answers a question "Unanswered").

import { el, formatCountdown } from "./dom.js";

// The one tool call an approval allows, as PAW will hold the runtime to it (the tool and
// its arguments); nothing when the confirm names no call (it then allows no gated tool).
function callLines(call) {
  if (!call || typeof call.name !== "string") return [];
  const args = call.input ?? call.args ?? {};
  return [
    el("p", { class: "approval-call-label" }, "Approving allows exactly this call, once:"),
    el("pre", { class: "approval-call" }, `${call.name} ${JSON.stringify(args, null, 2)}`),
  ];
}

function optionLabel(option) {
  if (option && typeof option === "object") return String(option.label ?? "");
  return String(option);
}

export class ApprovalPanels {
  /**
   * @param {HTMLElement} root
   * @param {{decide: (approvalId: string, decision: {approved?: boolean, answers?: string[]}) => Promise<void>}} options
   */
  constructor(root, { decide }) {
    this.root = root;
    this.decide = decide;
    this.panels = new Map();
    this.timer = setInterval(() => this.tick(), 1000);
  }

  /** An `agent_confirm_request` message (sent again on every connect: shown once). */
  show(request) {
    if (this.panels.has(request.approval_id)) return;
    const panel =
      request.kind === "confirm" ? this.confirmPanel(request) : this.questionPanel(request);
    panel.element.dataset.approvalId = request.approval_id;
    this.panels.set(request.approval_id, { ...panel, expiresAt: Date.parse(request.expires_at) });
    this.root.append(panel.element);
    this.tick();
    // Bring it to the person's attention (keyboard and screen reader), unless they are in
    // the middle of typing something.
    const typing = ["TEXTAREA", "INPUT"].includes(document.activeElement?.tagName) && document.activeElement.value;
    if (!typing) panel.focus.focus();
  }

  confirmPanel(request) {
    const countdown = el("span", { class: "approval-countdown", "aria-live": "off" });
    const approve = el("button", { type: "button", class: "primary" }, "Approve");
    const decline = el("button", { type: "button", class: "danger" }, "Decline");
    const heading = el("h2", {}, "The agent wants to do this — allow it?");
    const element = el(
      "section",
      { class: "approval-panel", role: "alertdialog", "aria-label": "Approval needed", dataset: { kind: "confirm" } },
      heading,
      el("pre", { class: "approval-prompt" }, request.prompt || ""),
      ...callLines(request.call),
      el("div", { class: "approval-actions" }, approve, decline, countdown),
    );
    const send = (approved) => this.submit(request.approval_id, { approved }, [approve, decline]);
    approve.addEventListener("click", () => send(true));
    decline.addEventListener("click", () => send(false));
    return { element, countdown, focus: approve, expiredText: "No decision in time: it will be declined." };
  }

  questionPanel(request) {
    const countdown = el("span", { class: "approval-countdown", "aria-live": "off" });
    const fields = [];
    const questions = (request.questions || []).length ? request.questions : [{ question: "The agent asks:", options: [] }];
    const blocks = questions.map((question, index) => {
      const id = `answer-${request.approval_id}-${index}`;
      const input = el("input", { type: "text", id, placeholder: "Type an answer", autocomplete: "off" });
      const buttons = (question.options || []).map((option) => {
        const label = optionLabel(option);
        const button = el("button", { type: "button", "aria-pressed": "false", title: option?.description || null }, label);
        button.addEventListener("click", () => {
          for (const other of buttons) other.setAttribute("aria-pressed", String(other === button));
          input.value = label;
        });
        return button;
      });
      fields.push(input);
      return el(
        "div",
        { class: "approval-question" },
        el("label", { for: id }, question.question || ""),
        buttons.length ? el("div", { class: "options", role: "group", "aria-label": "Choices" }, buttons) : null,
        input,
      );
    });
    const send = el("button", { type: "submit", class: "primary" }, "Send the answer");
    const element = el(
      "form",
      { class: "approval-panel", role: "alertdialog", "aria-label": "The agent has a question", dataset: { kind: "ask" } },
      el("h2", {}, "The agent has a question"),
      ...blocks,
      el("div", { class: "approval-actions" }, send, countdown),
    );
    element.addEventListener("submit", (event) => {
      event.preventDefault();
      const answers = fields.map((input) => input.value.trim());
      if (answers.some((answer) => !answer)) {
        const missing = fields.find((input) => !input.value.trim());
        missing.setCustomValidity("Pick an option or type an answer.");
        missing.reportValidity();
        missing.addEventListener("input", () => missing.setCustomValidity(""), { once: true });
        return;
      }
      this.submit(request.approval_id, { answers }, [send]);
    });
    const focus = element.querySelector(".options button") || fields[0];
    return { element, countdown, focus, expiredText: "No answer in time: the agent is told it went unanswered." };
  }

  async submit(approvalId, decision, buttons) {
    for (const button of buttons) button.disabled = true;
    try {
      await this.decide(approvalId, decision);
    } catch (error) {
      const panel = this.panels.get(approvalId);
      if (!panel) return;
      if (error.code === "approval_closed") {
        this.close(approvalId);
        return;
      }
      for (const button of buttons) button.disabled = false;
      panel.element.querySelector(".approval-error")?.remove();
      panel.element.append(el("p", { class: "approval-error run-error", role: "alert" }, error.message));
    }
  }

  /** An `agent_confirm_resolved` message (from any tab, the API or the deadline). */
  resolve(message) {
    this.close(message.approval_id);
  }

  close(approvalId) {
    const panel = this.panels.get(approvalId);
    if (!panel) return;
    const hadFocus = panel.element.contains(document.activeElement);
    panel.element.remove();
    this.panels.delete(approvalId);
    if (hadFocus) document.getElementById("prompt")?.focus();
  }

  /** Keep only the panels of these pending approval ids (after a reconnect). */
  keepOnly(pendingIds) {
    for (const id of [...this.panels.keys()]) if (!pendingIds.has(id)) this.close(id);
  }

  tick() {
    const now = Date.now();
    for (const panel of this.panels.values()) {
      const left = (panel.expiresAt - now) / 1000;
      panel.countdown.textContent = left > 0 ? `${formatCountdown(left)} left to decide` : panel.expiredText;
    }
  }
}
