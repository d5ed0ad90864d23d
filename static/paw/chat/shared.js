// A shared conversation's page (/s/<id>/): the snapshot's transcript built by the chat
// page's own Transcript from the share's runs and events (GET /api/shares/{id}/runs and
// .../events), read-only — no composer, no approvals, no runs — its files to download,
// and *Fork*, which starts the viewer's own conversation from it.

import { api, apiAll } from "./api.js";
import { el, formatBytes } from "./dom.js";
import { encodePath } from "./files.js";
import { Transcript } from "./transcript.js";
import { TurnVersions } from "./versions.js";

const config = JSON.parse(document.getElementById("paw-config").textContent);
const $ = (id) => document.getElementById(id);
const base = `/api/shares/${config.shareId}`;
const transcriptEl = $("transcript");
const runs = new Map();

function showError(text) {
  $("share-error").textContent = text || "";
  $("share-error").hidden = !text;
}

const transcript = new Transcript(transcriptEl, {
  fetchRun: async (runId) => runs.get(runId) || {},
  demoProvider: config.demoProvider,
  artifactUrl: (path) => `${base}/files/${encodePath(path)}`,
  plotlyUrl: config.plotlyUrl,
  saveExample: null,
  onChange: () => versions.refresh(),
});
// The versions of an edited or regenerated turn switch with the arrows; nothing starts.
const versions = new TurnVersions(transcript, { replace: null });

function fileChip(share, file) {
  const href = `${share.files_url}${encodePath(file.path)}`;
  return el(
    "li",
    { class: "chip" },
    el("a", { href, download: file.path.split("/").pop(), title: `Download ${file.path}` }, file.path),
    el("span", { class: "size" }, formatBytes(file.size)),
  );
}

function showFiles(share) {
  const uploads = share.files.filter((file) => file.upload);
  const made = share.files.filter((file) => !file.upload);
  $("share-uploads").replaceChildren(...uploads.map((file) => fileChip(share, file)));
  $("share-artifacts").replaceChildren(...made.map((file) => fileChip(share, file)));
  $("files-count").textContent = `(${share.files.length})`;
  if (share.files_left_out.length) {
    const names = share.files_left_out.map((file) => `${file.path} (${file.reason})`).join(", ");
    $("share-artifacts").after(el("p", { class: "muted small" }, `Not in this share: ${names}.`));
  }
}

async function load() {
  try {
    const share = await api("GET", base);
    showFiles(share);
    const list = await apiAll(`${base}/runs?page_size=100`);
    for (const run of list) runs.set(run.id, run);
    transcript.seedRuns(list);
    versions.seed(list);
    transcript.seedApprovals(share.approvals);
    let after = 0;
    for (;;) {
      const page = await api("GET", `${base}/events?after=${after}&limit=1000`);
      for (const event of page.events) transcript.handleEvent(event);
      after = page.next_after;
      if (!page.has_more) break;
    }
    versions.refresh();
  } catch (error) {
    showError(error.message);
  } finally {
    transcriptEl.setAttribute("aria-busy", "false");
  }
}

$("fork-share").addEventListener("click", async () => {
  $("fork-share").disabled = true;
  try {
    const conversation = await api("POST", `${base}/fork`);
    location.assign(`/c/${conversation.id}/`);
  } catch (error) {
    showError(error.message);
    $("fork-share").disabled = false;
  }
});

load();
