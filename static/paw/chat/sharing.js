// The header's *Share*: a dialog to share the open conversation read-only (with the
// members of some of one's teams, or everyone signed in, as PAW_SHARING allows; with an
// optional expiry), the link to copy, and this conversation's shares with *Update to
// now* and *Stop sharing* (POST/GET/DELETE /api/conversations/{id}/shares).

import { api } from "./api.js";
import { $, base, config, state } from "./page.js";
import { shareItem } from "./share_items.js";

/** Wire the Share button and dialog; call `show()` once the open conversation exists. */
export function setupSharing() {
  const button = $("share-conversation");
  const dialog = $("share-dialog");
  const form = $("share-form");
  const sharing = config.sharing || { audiences: [], teams: [] };
  if (!button || !sharing.audiences.length) return { show() {} };

  const showError = (text) => {
    $("share-dialog-error").textContent = text || "";
    $("share-dialog-error").hidden = !text;
  };
  const audience = () => form.querySelector("input[name=audience]:checked")?.value;
  const teamBoxes = () => [...form.querySelectorAll("input[name=team]")];
  const syncTeams = () => {
    for (const box of teamBoxes()) box.disabled = audience() !== "teams";
  };
  form.addEventListener("change", syncTeams);

  async function refresh() {
    const { shares } = await api("GET", `${base()}/shares`);
    const items = shares.map((share) =>
      shareItem(share, {
        teams: sharing.teams,
        onChange: () => refresh().catch((error) => showError(error.message)),
        onError: showError,
      }),
    );
    $("share-list").replaceChildren(...items);
    $("share-list-empty").hidden = shares.length > 0;
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    showError("");
    const body = { audience: audience() };
    if (body.audience === "teams") body.teams = teamBoxes().filter((box) => box.checked).map((box) => Number(box.value));
    const days = $("share-expires").value;
    if (days) body.expires_in_days = Number(days);
    $("share-create").disabled = true;
    try {
      await api("POST", `${base()}/shares`, body);
      await refresh();
      $("share-list").querySelector(".share-link input")?.focus();
    } catch (error) {
      showError(error.message);
    } finally {
      $("share-create").disabled = false;
    }
  });

  button.addEventListener("click", async () => {
    showError("");
    syncTeams();
    dialog.showModal();
    try {
      await refresh();
    } catch (error) {
      showError(error.message);
    }
  });
  $("share-close").addEventListener("click", () => dialog.close());

  return {
    show() {
      button.hidden = !state.conversationId;
    },
  };
}
