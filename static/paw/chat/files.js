// Files: uploads (button and drag-and-drop, several at once, a progress bar each), the
// uploaded files as chips, and the artifacts the agent made (images as thumbnails).

import { api, apiAll, upload } from "./api.js";
import { ATTACHABLE } from "./attachments.js";
import { confirmAction, el, formatBytes } from "./dom.js";

const INLINE_IMAGES = /\.(png|jpe?g|gif|webp)$/i;
const PARALLEL_UPLOADS = 3;

/** A workspace path for a URL: each segment percent-encoded, the slashes kept. */
export function encodePath(path) {
  return path.split("/").map(encodeURIComponent).join("/");
}

export class FilesPanel {
  /**
   * @param {{chips: HTMLElement, progress: HTMLElement, artifacts: HTMLElement,
   *          artifactEmpty: HTMLElement, maxBytes: number,
   *          conversationId: () => Promise<string>, currentId: () => string|null,
   *          onError: (message: string) => void, attachments?: object}} options
   *   `conversationId()` gives the open conversation's id, creating one when needed;
   *   `attachments` (an AttachmentTray) gives each image an "Attach" toggle.
   */
  constructor({ chips, progress, artifacts, artifactEmpty, maxBytes, conversationId, currentId, onError, attachments }) {
    this.onError = onError;
    this.attachments = attachments || null;
    this.chips = chips;
    this.progress = progress;
    this.artifacts = artifacts;
    this.artifactEmpty = artifactEmpty;
    this.maxBytes = maxBytes;
    this.conversationId = conversationId;
    this.currentId = currentId;
    this.queue = [];
    this.running = 0;
  }

  base() {
    return `/api/conversations/${this.currentId()}`;
  }

  async refresh() {
    if (!this.currentId()) return;
    await Promise.allSettled([this.refreshFiles(), this.refreshArtifacts()]);
  }

  async refreshFiles() {
    const files = await apiAll(`${this.base()}/files?page_size=100`);
    this.chips.replaceChildren(...files.map((file) => this.chip(file)));
    document.getElementById("file-empty").hidden = files.length > 0;
    this.uploadedCount = files.length;
    this.showCount();
  }

  chip(file) {
    const remove = el("button", { type: "button", "aria-label": `Remove ${file.name}`, title: "Remove" }, "×");
    remove.addEventListener("click", async () => {
      const sure = await confirmAction({
        title: `Remove ${file.name}?`,
        text: "The file is deleted from this conversation's workspace; the agent can no longer use it.",
        ok: "Remove",
        cancel: "Keep it",
      });
      if (!sure) return;
      try {
        await api("DELETE", `${this.base()}/files/${file.id}`);
        await this.refresh();
      } catch (error) {
        this.onError(error.message);
      }
    });
    return el(
      "li",
      { class: "chip", dataset: { fileId: file.id } },
      el("a", { href: `${this.base()}/files/${file.id}/content`, download: file.name, title: `Download ${file.name}` }, file.name),
      el("span", { class: "size" }, formatBytes(file.size)),
      this.attachments && ATTACHABLE.test(file.name) ? this.attachments.toggleButton(file.name) : null,
      remove,
    );
  }

  async refreshArtifacts() {
    const list = await apiAll(`${this.base()}/artifacts?page_size=100`);
    this.artifactEmpty.hidden = list.length > 0;
    this.madeCount = list.length;
    this.showCount();
    this.artifacts.replaceChildren(...list.map((artifact) => this.artifactItem(artifact)));
  }

  /** "(2 uploaded, 3 made)" beside the folded Files heading. */
  showCount() {
    const parts = [];
    if (this.uploadedCount) parts.push(`${this.uploadedCount} uploaded`);
    if (this.madeCount) parts.push(`${this.madeCount} made by the agent`);
    document.getElementById("files-count").textContent = parts.length ? `(${parts.join(", ")})` : "";
  }

  artifactItem(artifact) {
    const url = `${this.base()}/artifacts/${encodePath(artifact.path)}`;
    const version = encodeURIComponent(artifact.modified || "");
    const parts = [];
    if (INLINE_IMAGES.test(artifact.path)) {
      const full = `${url}?inline=1&v=${version}`;
      parts.push(
        el(
          "a",
          { href: full, target: "_blank", rel: "noopener", class: "thumbnail", title: `Open ${artifact.path} full size` },
          el("img", { src: full, alt: `${artifact.path} (chart or image made by the agent)`, loading: "lazy" }),
        ),
      );
    }
    parts.push(el("a", { href: url, download: "", class: "download", title: `Download ${artifact.path}` }, artifact.path));
    parts.push(el("span", { class: "size" }, formatBytes(artifact.size)));
    if (this.attachments && ATTACHABLE.test(artifact.path)) parts.push(this.attachments.toggleButton(artifact.path));
    return el("li", { class: "artifact", dataset: { path: artifact.path } }, ...parts);
  }

  /** Queue files for upload (from the button or a drop); each gets a progress row. */
  add(fileList) {
    for (const file of fileList) {
      const bar = el("progress", { max: 100, value: 0, "aria-label": `Uploading ${file.name}` });
      const state = el("span", { class: "upload-state" }, "waiting…");
      const row = el("li", { class: "upload", dataset: { state: "waiting" } }, el("span", {}, file.name), bar, state);
      this.progress.append(row);
      if (file.size > this.maxBytes) {
        this.fail(row, state, bar, `too large: ${formatBytes(file.size)}, the limit is ${formatBytes(this.maxBytes)}`);
        continue;
      }
      this.queue.push({ file, row, bar, state });
    }
    this.pump();
  }

  pump() {
    while (this.running < PARALLEL_UPLOADS && this.queue.length) {
      const item = this.queue.shift();
      this.running += 1;
      this.send(item).finally(() => {
        this.running -= 1;
        this.pump();
      });
    }
  }

  async send({ file, row, bar, state }) {
    row.dataset.state = "uploading";
    state.textContent = "0%";
    try {
      const id = await this.conversationId();
      const { promise } = upload(`/api/conversations/${id}/files`, file, (loaded, total) => {
        const percent = Math.round((loaded / total) * 100);
        bar.value = percent;
        state.textContent = `${percent}%`;
      });
      const created = await promise;
      bar.value = 100;
      row.dataset.state = "done";
      state.textContent = created.name === file.name ? "uploaded" : `uploaded as ${created.name}`;
      await this.refreshFiles();
      setTimeout(() => row.remove(), 2500);
    } catch (error) {
      const reason = error.status === 413 ? `too large: the limit is ${formatBytes(this.maxBytes)}` : error.message;
      this.fail(row, state, bar, reason);
    }
  }

  fail(row, state, bar, reason) {
    row.dataset.state = "error";
    bar.hidden = true;
    state.textContent = `not uploaded — ${reason}`;
    state.setAttribute("role", "alert");
    const dismiss = el("button", { type: "button", class: "link", "aria-label": "Dismiss" }, "dismiss");
    dismiss.addEventListener("click", () => row.remove());
    row.append(dismiss);
  }

  /** Drag-and-drop of files onto `zone`, with `overlay` shown while files hover it. */
  acceptDrops(zone, overlay) {
    let depth = 0;
    const hasFiles = (event) => [...(event.dataTransfer?.types || [])].includes("Files");
    zone.addEventListener("dragenter", (event) => {
      if (!hasFiles(event)) return;
      event.preventDefault();
      depth += 1;
      overlay.hidden = false;
    });
    zone.addEventListener("dragover", (event) => {
      if (!hasFiles(event)) return;
      event.preventDefault();
      event.dataTransfer.dropEffect = "copy";
    });
    zone.addEventListener("dragleave", () => {
      depth = Math.max(0, depth - 1);
      if (!depth) overlay.hidden = true;
    });
    zone.addEventListener("drop", (event) => {
      if (!hasFiles(event)) return;
      event.preventDefault();
      depth = 0;
      overlay.hidden = true;
      this.add(event.dataTransfer.files);
    });
  }
}
