// Small DOM and formatting helpers shared by the chat page's modules.

/**
 * Create an element: el("a", {href: "/x", class: "y"}, "text", child, ...).
 * Attributes set to null, undefined or false are left out; `true` sets an empty attribute.
 * Text children are inserted as text (never parsed as HTML).
 */
export function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "dataset") Object.assign(node.dataset, value);
    else if (name.startsWith("on") && typeof value === "function") node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const numbers = new Intl.NumberFormat();

/** 1234567 → "1,234,567" (in the reader's locale). */
export function formatNumber(value) {
  return numbers.format(value || 0);
}

/** A size in bytes as "512 B", "3.4 KB", "12 MB" (powers of 1024, like the file manager). */
export function formatBytes(bytes) {
  const units = ["B", "KB", "MB", "GB", "TB"];
  let value = Number(bytes) || 0;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  const digits = unit === 0 || value >= 100 ? 0 : value >= 10 ? 1 : 2;
  return `${value.toFixed(digits)} ${units[unit]}`;
}

/** A tool call as a row label: run_python(code='import pandas…', timeout=30). */
export function formatCall(name, args) {
  if (!args || typeof args !== "object") return `${name}()`;
  const parts = Object.entries(args).map(([key, value]) => {
    const shown = typeof value === "string" ? value : JSON.stringify(value);
    return `${key}=${shown}`;
  });
  return `${name}(${parts.join(", ")})`;
}

/** Seconds as "1:05" (minutes and seconds). */
export function formatCountdown(seconds) {
  const s = Math.max(0, Math.ceil(seconds));
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, "0")}`;
}

/** Whether a scrollable element is (nearly) scrolled to its end. */
export function nearBottom(element, slack = 80) {
  return element.scrollHeight - element.scrollTop - element.clientHeight < slack;
}

/**
 * Ask the person to confirm a destructive action in the page's confirm dialog:
 * confirmAction({title, text, ok: "Delete", cancel: "Keep it"}) → Promise<boolean>.
 */
export function confirmAction({ title, text, ok, cancel = "Cancel" }) {
  const dialog = document.getElementById("confirm-dialog");
  dialog.querySelector("#confirm-heading").textContent = title;
  dialog.querySelector("#confirm-text").textContent = text;
  dialog.querySelector("#confirm-ok").textContent = ok;
  dialog.querySelector("#confirm-cancel").textContent = cancel;
  dialog.returnValue = "";
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
  });
}
