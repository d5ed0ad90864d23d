// The chat page on a phone (max-width 48rem): the conversation list is a drawer over the
// page, behind the menu button, with a backdrop; Escape, a tap on the backdrop or on a
// conversation closes it, and the page behind it is inert while it is open. The header's
// less used controls (model, data, auto-approve, rename, delete...) fold behind the
// "More" button, so that the transcript gets the screen.

import { $ } from "./page.js";

export const NARROW = "(max-width: 48rem)";

/** Wire the drawer and the header's fold; returns nothing. */
export function setupDrawer() {
  const narrow = window.matchMedia(NARROW);
  const sidebar = $("sidebar");
  const main = $("main");
  const toggle = $("sidebar-toggle");
  const backdrop = document.createElement("div");
  backdrop.id = "drawer-backdrop";
  backdrop.className = "drawer-backdrop";
  backdrop.hidden = true;
  sidebar.after(backdrop);

  const isOpen = () => document.body.classList.contains("sidebar-open");
  function setOpen(open, { focus = true } = {}) {
    document.body.classList.toggle("sidebar-open", open);
    toggle.setAttribute("aria-expanded", String(open));
    backdrop.hidden = !open;
    main.inert = open && narrow.matches; // keyboard and screen reader stay in the drawer
    if (!focus) return;
    if (open) sidebar.querySelector("#conversation-list a[aria-current=page], #conversation-list a, #new-conversation")?.focus();
    else toggle.focus();
  }

  toggle.addEventListener("click", () => setOpen(!isOpen()));
  backdrop.addEventListener("click", () => setOpen(false));
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && isOpen()) {
      event.preventDefault();
      setOpen(false);
    }
  });
  sidebar.addEventListener("click", (event) => {
    if (isOpen() && event.target.closest("#conversation-list a, #new-conversation")) setOpen(false, { focus: false });
  });
  // Turning the phone (or widening the window) past the breakpoint: no drawer state left.
  narrow.addEventListener("change", () => {
    if (!narrow.matches && isOpen()) setOpen(false, { focus: false });
  });

  // The header's fold (only shown on narrow screens).
  const head = document.querySelector(".conversation-head");
  const more = $("head-more");
  more.addEventListener("click", () => {
    const open = !head.classList.contains("expanded");
    head.classList.toggle("expanded", open);
    more.setAttribute("aria-expanded", String(open));
  });

  // On a phone the conversation gets the height: the files start folded.
  if (narrow.matches) $("files").open = false;
}
