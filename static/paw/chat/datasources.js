// The datasource picker: the enabled datasources (GET /api/datasources) as checkboxes;
// the ones ticked are kept on the conversation (PATCH datasources) and PAW gives them to
// every run of it (a run started through the API may name its own). Hidden when the
// server has no datasource.

import { api } from "./api.js";
import { el } from "./dom.js";

export class DatasourcePicker {
  /**
   * @param {HTMLDetailsElement} root the picker (its <summary> says what is chosen)
   * @param {{save: (slugs: string[]) => Promise<string[]>, onError: (message: string) => void}} options
   *   `save(slugs)` keeps the choice on the conversation (creating it when needed) and
   *   gives back the slugs kept.
   */
  constructor(root, { save, onError }) {
    this.root = root;
    this.save = save;
    this.onError = onError;
    this.list = root.querySelector("ul");
    this.label = root.querySelector(".datasource-label");
    this.datasources = [];
    this.chosen = [];
  }

  async load() {
    const answer = await api("GET", "/api/datasources");
    this.datasources = answer.datasources || [];
    this.root.hidden = this.datasources.length === 0;
    this.render();
  }

  /** The open conversation's choice (its `datasources`). */
  set(conversation) {
    this.chosen = Array.isArray(conversation?.datasources) ? [...conversation.datasources] : [];
    this.render();
  }

  render() {
    const known = new Map(this.datasources.map((d) => [d.slug, d]));
    const names = this.chosen.filter((slug) => known.has(slug)).map((slug) => known.get(slug).name || slug);
    this.label.textContent = names.length ? names.join(", ") : "none";
    this.list.replaceChildren(
      ...this.datasources.map((source) => {
        const box = el("input", { type: "checkbox", value: source.slug, checked: this.chosen.includes(source.slug) });
        box.addEventListener("change", () => this.changed(box));
        const about = [source.dialect, source.description].filter(Boolean).join(" · ");
        return el(
          "li",
          { dataset: { slug: source.slug } },
          el("label", { title: about }, box, " ", source.name || source.slug, about ? el("span", { class: "muted small" }, ` ${about}`) : null),
        );
      }),
    );
  }

  /** Resolves once the last change of the choice is saved (or failed). */
  settled() {
    return this.saving || Promise.resolve();
  }

  async changed(box) {
    const previous = [...this.chosen];
    // A datasource disabled or deleted since it was chosen is dropped (PAW would refuse it).
    const known = new Set(this.datasources.map((source) => source.slug));
    const kept = this.chosen.filter((slug) => known.has(slug));
    const wanted = box.checked ? [...kept, box.value] : kept.filter((slug) => slug !== box.value);
    this.root.dataset.saving = "";
    const saving = this.save(wanted);
    // A message sent right after a tick waits for it (settled()): its run gets the choice.
    this.saving = saving.then(() => {}, () => {});
    try {
      this.chosen = await saving;
    } catch (error) {
      this.chosen = previous;
      this.onError(error.message);
    } finally {
      delete this.root.dataset.saving;
      this.render();
    }
  }
}
