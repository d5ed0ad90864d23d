// Images attached to the next message: the "Attach" toggle of each image in the files
// panel, the tray above the composer listing what goes with the message, and a warning
// when the chosen model does not accept images (the server refuses such a message with
// 400 model_without_vision: its refusal then takes the warning's place, said once;
// nothing is dropped silently).

import { el } from "./dom.js";

/** Names the model can be sent as images (PNG, JPEG, WebP; the server checks the bytes). */
export const ATTACHABLE = /\.(png|jpe?g|webp)$/i;

export class AttachmentTray {
  /**
   * @param {{tray: HTMLElement, note: HTMLElement, picker: object}} options
   *   `tray` lists the attached images, `note` says when the chosen model cannot take
   *   them; `picker` is the ModelPicker (its providers carry `vision_models`).
   */
  constructor({ tray, note, picker }) {
    this.tray = tray;
    this.note = note;
    this.picker = picker;
    this.selected = [];
    this.refusal = ""; // the server's refusal of the last message, until something changes
    this.buttons = new Map(); // path → the toggles showing it (files panel)
    picker.onProvider(() => {
      this.refusal = "";
      this.render();
    });
  }

  /**
   * The server refused the message for its images (400 model_without_vision): `detail`,
   * its words, shown in the warning's place until the images or the model change.
   */
  refused(detail) {
    this.refusal = detail;
    this.render();
  }

  /** The workspace paths attached to the next message, in the order chosen. */
  paths() {
    return [...this.selected];
  }

  has(path) {
    return this.selected.includes(path);
  }

  toggle(path) {
    this.refusal = "";
    this.selected = this.has(path) ? this.selected.filter((p) => p !== path) : [...this.selected, path];
    this.render();
  }

  clear() {
    this.refusal = "";
    this.selected = [];
    this.render();
  }

  /** Forget attached paths that are no longer in the workspace (`present`: every path listed). */
  keepOnly(present) {
    const kept = this.selected.filter((path) => present.has(path));
    if (kept.length !== this.selected.length) {
      this.refusal = "";
      this.selected = kept;
      this.render();
    }
  }

  /** An "Attach" toggle for the image at `path` (a chip or an artifact of the files panel). */
  toggleButton(path) {
    const button = el("button", { type: "button", class: "attach-toggle", dataset: { path } });
    button.addEventListener("click", () => this.toggle(path));
    if (!this.buttons.has(path)) this.buttons.set(path, new Set());
    this.buttons.get(path).add(button);
    this.paintButton(button, path);
    return button;
  }

  paintButton(button, path) {
    const on = this.has(path);
    button.setAttribute("aria-pressed", on ? "true" : "false");
    button.textContent = on ? "Attached" : "Attach";
    button.title = on ? `Do not send ${path} with the next message` : `Send ${path} to the model with the next message`;
    button.setAttribute("aria-label", on ? `Detach ${path} from the message` : `Attach ${path} to the message`);
  }

  /** The chosen model, as far as the page knows it: whether it accepts images. */
  modelAcceptsImages() {
    const name = this.picker.effectiveProvider();
    const provider = this.picker.providers.find((p) => p.name === name);
    if (!provider) return { known: false };
    const model = (this.picker.choice.llm_provider === name && this.picker.choice.llm_model) || provider.default_model;
    return { known: true, model, accepts: (provider.vision_models || []).includes(model) };
  }

  render() {
    for (const [path, buttons] of this.buttons) {
      for (const button of buttons) {
        if (!button.isConnected) buttons.delete(button);
        else this.paintButton(button, path);
      }
    }
    this.tray.replaceChildren(
      ...this.selected.map((path) => {
        const remove = el("button", { type: "button", "aria-label": `Detach ${path}`, title: "Detach" }, "×");
        remove.addEventListener("click", () => this.toggle(path));
        return el("li", { class: "chip attached", dataset: { path } }, el("span", {}, `Image: ${path}`), remove);
      }),
    );
    this.tray.hidden = this.selected.length === 0;
    const vision = this.modelAcceptsImages();
    const warn = this.selected.length > 0 && vision.known && !vision.accepts;
    this.note.textContent = this.refusal
      ? this.refusal
      : warn
        ? `The chosen model (${vision.model}) does not accept images: pick one that does, or detach the image.`
        : "";
    this.note.hidden = !this.note.textContent;
  }
}
