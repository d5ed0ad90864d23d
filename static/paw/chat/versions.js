// The versions of the last turn: editing the last prompt (inline, Enter resends, Escape
// cancels), regenerating the last answer, and the arrows "‹ 1/2 ›" that switch between
// the versions of a turn that was edited or regenerated.
//
// A new version is a new run that replaces the turn's newest one (`POST .../runs` with
// `replaces`, see docs/api.md); every version stays stored and on the page, one of them
// shown at a time (the newest, the one the agent remembers, unless the person switches).
// The links come from the runs' `replaces` (the run list on load, the POST's answer, the
// `run.status` messages of other tabs).

import { el } from "./dom.js";

export class TurnVersions {
  /**
   * @param {import("./transcript.js").Transcript} transcript
   * @param {{replace: (runId: string, prompt: string|null) => Promise<object>, onError: (message: string) => void,
   *          started: (run: object) => void}} options
   *   `replace(runId, prompt)`: starts the new version (prompt null: regenerate) and
   *   resolves to the new run (null: read-only, a share's page: no edit, no regenerate);
   *   `started(run)`: the page shows the new run as a sent prompt.
   */
  constructor(transcript, { replace, onError, started }) {
    this.transcript = transcript;
    this.replace = replace;
    this.onError = onError || (() => {});
    this.started = started || (() => {});
    this.replacesOf = new Map(); // run id → the id of the run it replaces
    this.shown = new Map(); // first version's id → the id of the version shown
    this.controls = new Map(); // run id → {nav, position, previous, next, edit, regenerate, actions}
    this.editing = null;
    this.busy = false;
  }

  /** Runs from the run list (any order): their links. */
  seed(runs) {
    for (const run of runs) this.note({ id: run.id, replaces: run.replaces });
  }

  /** One run's link (`{id, replaces}`); a new version is shown at once. */
  note({ id, replaces }) {
    if (!id || !replaces || this.replacesOf.get(id) === replaces) return;
    this.replacesOf.set(id, replaces);
    this.shown.set(this.first(id), id);
  }

  first(id) {
    const seen = new Set();
    while (this.replacesOf.has(id) && !seen.has(id)) {
      seen.add(id);
      id = this.replacesOf.get(id);
    }
    return id;
  }

  /** The turns in page order: each `{first, ids}`, the ids of its versions on the page, oldest first. */
  turns() {
    const next = new Map();
    for (const [later, earlier] of this.replacesOf) next.set(earlier, later);
    const turns = [];
    const seen = new Set();
    for (const runId of this.transcript.runs.keys()) {
      const first = this.first(runId);
      if (seen.has(first)) continue;
      seen.add(first);
      const ids = [];
      for (let id = first; id && ids.length <= this.replacesOf.size; id = next.get(id)) {
        if (this.transcript.runs.has(id)) ids.push(id);
      }
      turns.push({ first, ids });
    }
    return turns;
  }

  /** Show one version of each turn, with its arrows; the last turn's edit and regenerate. */
  refresh() {
    const turns = this.turns();
    const active = Boolean(this.transcript.activeRun());
    turns.forEach(({ first, ids }, index) => {
      let shownId = this.shown.get(first);
      if (!ids.includes(shownId)) shownId = ids[ids.length - 1];
      const last = index === turns.length - 1;
      ids.forEach((runId, position) => {
        const view = this.transcript.runs.get(runId);
        const controls = this.controlsOf(view);
        view.element.hidden = runId !== shownId;
        view.element.dataset.version = String(position + 1);
        controls.nav.hidden = ids.length < 2;
        controls.position.textContent = `${position + 1}/${ids.length}`;
        controls.nav.title = position < ids.length - 1 ? "An earlier version: the agent remembers only the newest one." : "";
        controls.previous.disabled = position === 0;
        controls.next.disabled = position === ids.length - 1;
        const editable = Boolean(this.replace) && last && runId === shownId && !active && !view.active && !this.busy;
        controls.edit.hidden = !editable || view.promptEl.hidden || this.editing === view;
        controls.regenerate.hidden = !editable || !view.status;
      });
    });
  }

  controlsOf(view) {
    let controls = this.controls.get(view.runId);
    if (controls) return controls;
    const step = (delta) => () => {
      const { first, ids } = this.turns().find((turn) => turn.ids.includes(view.runId));
      const target = ids[ids.indexOf(view.runId) + delta];
      if (!target) return;
      this.shown.set(first, target);
      this.refresh();
      this.controlsOf(this.transcript.runs.get(target))[delta < 0 ? "previous" : "next"].focus();
    };
    const previous = el("button", { type: "button", class: "version-step", "aria-label": "Previous version", onclick: step(-1) }, "‹");
    const next = el("button", { type: "button", class: "version-step", "aria-label": "Next version", onclick: step(1) }, "›");
    const position = el("span", { class: "version-position", "aria-live": "polite" });
    const nav = el("span", { class: "versions", role: "group", "aria-label": "Versions of this turn", hidden: true }, previous, position, next);
    const edit = el("button", { type: "button", class: "edit-prompt", title: "Edit and resend", hidden: true, onclick: () => this.edit(view) }, "Edit");
    const regenerate = el(
      "button",
      { type: "button", class: "regenerate", title: "Answer this prompt again", hidden: true, onclick: () => this.regenerate(view) },
      "Regenerate",
    );
    const actions = el("div", { class: "prompt-actions" }, edit);
    view.promptEl.after(actions);
    view.footerEl.prepend(nav);
    view.footerEl.append(regenerate);
    controls = { nav, position, previous, next, edit, regenerate, actions };
    this.controls.set(view.runId, controls);
    return controls;
  }

  /** The inline editor in place of the prompt: Enter resends, Shift+Enter breaks the line, Escape cancels. */
  edit(view) {
    if (this.editing) return;
    this.editing = view;
    const controls = this.controlsOf(view);
    const text = view.promptText.textContent;
    const box = el("textarea", { class: "prompt-editor", rows: Math.min(8, text.split("\n").length + 1), "aria-label": "Edit your message" });
    box.value = text;
    const close = () => {
      form.remove();
      view.promptEl.hidden = false;
      this.editing = null;
      this.refresh();
      controls.edit.focus();
    };
    const send = el("button", { type: "submit", class: "primary" }, "Send");
    const cancel = el("button", { type: "button", onclick: close }, "Cancel");
    const form = el("form", { class: "prompt-edit" }, box, el("div", { class: "prompt-edit-actions" }, cancel, send));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const prompt = box.value.trim();
      if (!prompt) return box.focus();
      send.disabled = true;
      if (await this.start(view, prompt)) {
        form.remove();
        view.promptEl.hidden = false;
        this.editing = null;
        this.refresh();
      } else {
        send.disabled = false;
      }
    });
    box.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        event.preventDefault();
        close();
      } else if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        form.requestSubmit();
      }
    });
    view.promptEl.hidden = true;
    controls.actions.before(form);
    this.refresh();
    box.focus();
    box.setSelectionRange(box.value.length, box.value.length);
  }

  regenerate(view) {
    return this.start(view, null);
  }

  /** Start the new version; true when it started (else the reason is shown). */
  async start(view, prompt) {
    if (this.busy) return false;
    this.busy = true;
    this.refresh();
    try {
      const run = await this.replace(view.runId, prompt);
      this.note(run);
      this.started(run);
      return true;
    } catch (error) {
      this.onError(error.message);
      return false;
    } finally {
      this.busy = false;
      this.refresh();
    }
  }
}
