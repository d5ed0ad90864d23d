// The header's "Export ▸ Markdown / JSON / Notebook" menu: links to
// GET /api/conversations/{id}/export?format=md|json|ipynb (the session signs them in),
// shown once the conversation exists. The menu closes after a choice, on Escape and on
// a click elsewhere.

import { $, base, state } from "./page.js";

/** Wire the export menu; call `show()` when the open conversation has come to exist. */
export function setupExports() {
  const menu = $("export-menu");
  const links = menu.querySelectorAll("a[data-format]");
  const point = () => {
    if (!state.conversationId) return;
    for (const link of links) link.href = `${base()}/export?format=${link.dataset.format}`;
  };
  menu.addEventListener("toggle", point);
  for (const link of links) link.addEventListener("click", () => (menu.open = false));
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && menu.open) menu.open = false;
  });
  document.addEventListener("click", (event) => {
    if (menu.open && !menu.contains(event.target)) menu.open = false;
  });
  return {
    show() {
      point();
      menu.hidden = false;
    },
  };
}
