// One share as its owner sees it (the chat header's Share dialog and the Shared by me
// page): who may see it, its link to copy, when its snapshot was taken and until when it
// works, and *Update* (a new snapshot under the same link) and *Stop sharing*.

import { api } from "./api.js";
import { el } from "./dom.js";

const STATUS_TEXT = {
  active: "",
  expired: "Expired: the link no longer works (renewing it takes a new snapshot).",
  not_allowed: "Stopped by the server's setting (PAW_SHARING): the link no longer works.",
};

const when = (iso) => new Date(iso).toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" });

/** "Members of analysts, finance" / "Everyone signed in" (team names from `teams`). */
export function audienceText(share, teams) {
  if (share.audience === "signed_in") return "Everyone signed in";
  const names = share.teams.map((id) => teams.find((team) => team.id === id)?.name || `team ${id}`);
  return `Members of ${names.join(", ")}`;
}

/** The REST URL of one share of its conversation. */
export function shareBase(share) {
  return `/api/conversations/${share.conversation.id}/shares/${share.id}`;
}

async function copy(input, button) {
  try {
    await navigator.clipboard.writeText(input.value);
  } catch {
    input.select();
    document.execCommand("copy"); // where the clipboard API is not offered
  }
  button.textContent = "Copied";
  setTimeout(() => (button.textContent = "Copy link"), 2000);
}

/**
 * A list item for `share`: `teams` ([{id, name}]) names its teams; `onChange()` after an
 * update or a stop; `onError(message)`; `title`: also name its conversation (a link).
 */
export function shareItem(share, { teams, onChange, onError, title = false }) {
  const link = el("input", { type: "text", readonly: true, value: share.url, "aria-label": "Link to this share" });
  const copyButton = el("button", { type: "button", class: "share-copy" }, "Copy link");
  copyButton.addEventListener("click", () => copy(link, copyButton));
  const act = (label, className, action) => {
    const button = el("button", { type: "button", class: className }, label);
    button.addEventListener("click", async () => {
      button.disabled = true;
      try {
        await action();
        onChange();
      } catch (error) {
        onError(error.message);
        button.disabled = false;
      }
    });
    return button;
  };
  const expires = share.expires ? ` · works until ${when(share.expires)}` : "";
  return el(
    "li",
    { class: "share-item", dataset: { shareId: share.id, status: share.status } },
    title
      ? el("p", {}, el("a", { href: `/c/${share.conversation.id}/` }, share.conversation.title || "Untitled conversation"))
      : null,
    el("p", {}, el("strong", { class: "share-audience" }, audienceText(share, teams)), el("span", { class: "muted small" }, ` · as it was on ${when(share.updated)}${expires}`)),
    STATUS_TEXT[share.status] ? el("p", { class: "share-status small", dataset: { status: share.status } }, STATUS_TEXT[share.status]) : null,
    el("p", { class: "share-link" }, link, copyButton),
    el(
      "p",
      { class: "share-actions" },
      share.status === "expired"
        ? act("Renew for 7 days", "share-update", () => api("POST", `${shareBase(share)}/update`, { expires_in_days: 7 }))
        : act("Update to now", "share-update", () => api("POST", `${shareBase(share)}/update`, {})),
      act("Stop sharing", "danger share-stop", () => api("DELETE", shareBase(share))),
    ),
  );
}
