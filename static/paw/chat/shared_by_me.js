// The Shared by me page (/shares/): the person's shares across their conversations
// (GET /api/shares), each with its link, *Update to now* and *Stop sharing*.

import { apiAll } from "./api.js";
import { shareItem } from "./share_items.js";

const config = JSON.parse(document.getElementById("paw-config").textContent);
const $ = (id) => document.getElementById(id);

function showError(text) {
  $("shares-error").textContent = text || "";
  $("shares-error").hidden = !text;
}

async function refresh() {
  try {
    const shares = await apiAll("/api/shares?page_size=100");
    $("shares").replaceChildren(
      ...shares.map((share) => shareItem(share, { teams: config.sharing.teams, onChange: refresh, onError: showError, title: true })),
    );
    $("shares-empty").hidden = shares.length > 0;
  } catch (error) {
    showError(error.message);
  }
}

refresh();
