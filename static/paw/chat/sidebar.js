// The sidebar: the person's conversations grouped by the day of their last activity
// (Today, Yesterday, earlier dates), newest first, each with the time of its last
// activity, "running" while the agent works and "waiting for you" (with the time left)
// while an approval waits. Live over the person's own websocket (user_socket.js): every
// change to one of their conversations arrives as its new state; on every (re)connect
// the REST list is read again. A search box narrows the list (GET
// /api/conversations?search=), the matched words marked. A title too long for its line
// is cut, except where that would hide something: cut to the same text as another
// title, or with a matched word in the cut part (a snippet too), it is shown whole.

import { api, apiAll } from "./api.js";
import { el, formatCountdown } from "./dom.js";

const LIST_SIZE = 100;
const SEARCH_DELAY_MS = 250;

/** Local midnight of a date, as a number (for comparing days). */
function dayOf(date) {
  return new Date(date.getFullYear(), date.getMonth(), date.getDate()).getTime();
}

/** "Today", "Yesterday", or the date ("Mon 30 Nov", with the year when not this one). */
export function dayLabel(date, now = new Date()) {
  const days = Math.round((dayOf(now) - dayOf(date)) / 86_400_000);
  if (days === 0) return "Today";
  if (days === 1) return "Yesterday";
  const options = { weekday: "short", day: "numeric", month: "short" };
  if (date.getFullYear() !== now.getFullYear()) options.year = "numeric";
  return date.toLocaleDateString(undefined, options);
}

const timeFormat = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit" });

/** The words of a search, for marking them (as the server splits them: letters and digits). */
export function searchWords(search) {
  return (search.toLowerCase().match(/[\p{L}\p{N}_]+/gu) || []).filter((w) => w !== "or");
}

/**
 * `text` as nodes with every word starting with one of `words` marked (<mark>): text
 * nodes only, never HTML.
 */
export function highlighted(text, words) {
  if (!words.length) return [text];
  const escaped = [...words].sort((a, b) => b.length - a.length).map((w) => w.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
  const pattern = new RegExp(`(${escaped.join("|")})[\\p{L}\\p{N}_]*`, "giu");
  const nodes = [];
  let last = 0;
  for (const found of text.matchAll(pattern)) {
    if (found.index > last) nodes.push(text.slice(last, found.index));
    nodes.push(el("mark", {}, found[0]));
    last = found.index + found[0].length;
  }
  if (last < text.length) nodes.push(text.slice(last));
  return nodes;
}

export class Sidebar {
  /**
   * @param {HTMLUListElement} list
   * @param {HTMLElement} emptyNote
   * @param {() => string | null} currentId the open conversation's id
   * @param {{search?: HTMLInputElement, searchNote?: HTMLElement, onChange?: (conversations: object[]) => void}} options
   *   onChange: the conversations (all known, with their waiting approvals) after each change.
   */
  constructor(list, emptyNote, currentId, { search = null, searchNote = null, onChange = () => {} } = {}) {
    this.list = list;
    this.emptyNote = emptyNote;
    this.currentId = currentId;
    this.onChange = onChange;
    this.conversations = new Map(); // id → the latest state known
    this.asOf = new Map(); // id → `as_of` of the last live state applied
    this.results = null; // a search's results ([{id, match}]), or null: the whole list
    this.search = search;
    this.searchNote = searchNote;
    this.searchText = "";
    this.loading = null;
    this.during = null; // live states received while the list is being read
    this.loaded = false; // the REST list was read once (before, nothing is announced)
    if (search) {
      let timer = null;
      search.addEventListener("input", () => {
        clearTimeout(timer);
        timer = setTimeout(() => this.runSearch(search.value), SEARCH_DELAY_MS);
      });
      search.addEventListener("keydown", (event) => {
        if (event.key === "Escape" && search.value) {
          search.value = "";
          this.runSearch("");
        }
      });
    }
    // The time left of waiting approvals counts down here; nothing is fetched for it.
    setInterval(() => this.tick(), 1000);
    // Where titles are cut depends on the list's width (and a hidden list, the drawer of a
    // phone, has none): measured again whenever it changes.
    new ResizeObserver(() => this.fitLines()).observe(list);
  }

  /** Read the whole list again (the REST API), then show it. */
  async refresh() {
    if (this.loading) return this.loading;
    this.during = [];
    this.loading = (async () => {
      let conversations;
      try {
        conversations = await apiAll(`/api/conversations?page_size=${LIST_SIZE}`);
      } catch {
        return; // keep the list shown; the next (re)connect reads it again
      } finally {
        this.loading = null;
      }
      this.conversations = new Map();
      this.asOf.clear();
      for (const c of conversations) this.conversations.set(c.id, { ...c, active: Boolean(c.active_run_id) });
      // What arrived live while the list was read is at least as new as the list.
      for (const state of this.during || []) this.apply(state, { render: false });
      this.during = null;
      this.loaded = true;
      this.render();
    })();
    return this.loading;
  }

  /** A message of the person's websocket (user_socket.js). */
  onMessage(message) {
    if (message.type === "conversation.updated") {
      if (this.during) this.during.push(message.conversation);
      this.apply(message.conversation);
    } else if (message.type === "conversation.removed") {
      this.conversations.delete(message.id);
      if (this.results) this.results = this.results.filter((r) => r.id !== message.id);
      this.render();
    }
  }

  apply(state, { render = true } = {}) {
    const previous = this.asOf.get(state.id);
    if (previous !== undefined && state.as_of !== undefined && state.as_of < previous) return; // older
    if (state.as_of !== undefined) this.asOf.set(state.id, state.as_of);
    const known = this.conversations.get(state.id) || {};
    this.conversations.set(state.id, { ...known, ...state });
    if (render) this.render();
  }

  async runSearch(text) {
    const search = text.trim();
    this.searchText = search;
    if (this.searchNote) this.searchNote.hidden = true;
    if (!search) {
      this.results = null;
      this.render();
      return;
    }
    let page;
    try {
      page = await api("GET", `/api/conversations?page_size=50&search=${encodeURIComponent(search)}`);
    } catch (error) {
      if (this.searchText !== search) return;
      if (this.searchNote) {
        this.searchNote.textContent = error.message;
        this.searchNote.hidden = false;
      }
      return;
    }
    if (this.searchText !== search) return; // a newer search is under way
    for (const c of page.results) {
      if (!this.conversations.has(c.id)) this.conversations.set(c.id, { ...c, active: Boolean(c.active_run_id) });
    }
    this.results = page.results.map((c) => ({ id: c.id, match: c.match }));
    this.render();
  }

  /** The conversations shown, newest activity first (or the search's results, in their order). */
  shown() {
    if (this.results) return this.results.map((r) => ({ ...this.conversations.get(r.id), match: r.match })).filter((c) => c.id);
    const time = (c) => Date.parse(c.last_activity || c.created) || 0;
    return [...this.conversations.values()].sort((a, b) => time(b) - time(a));
  }

  render() {
    const conversations = this.shown();
    const words = this.results ? searchWords(this.searchText) : [];
    this.emptyNote.textContent = this.results ? "No conversation matches." : "No conversations yet.";
    this.emptyNote.hidden = conversations.length > 0;
    // Titles used more than once get the start of their id, to tell them apart.
    const titleCount = new Map();
    for (const c of conversations) titleCount.set(this.titleOf(c), (titleCount.get(this.titleOf(c)) || 0) + 1);
    const groups = [];
    for (const c of conversations) {
      const label = dayLabel(new Date(c.last_activity || c.created || Date.now()));
      if (!groups.length || groups[groups.length - 1].label !== label) groups.push({ label, items: [] });
      groups[groups.length - 1].items.push(c);
    }
    this.list.replaceChildren(
      ...groups.map((group) =>
        el(
          "li",
          { class: "day-group" },
          el("h2", { class: "day-heading" }, group.label),
          el("ul", { "aria-label": group.label }, ...group.items.map((c) => this.item(c, { words, twin: titleCount.get(this.titleOf(c)) > 1 }))),
        ),
      ),
    );
    this.fitLines();
    if (this.loaded) this.onChange([...this.conversations.values()]);
  }

  /**
   * Show whole (wrapped) the lines whose cut would hide something: different titles cut
   * to the same text, and a title or a search's snippet with a matched word in its cut
   * part. The others keep their one line. Needs the list laid out: nothing is done while
   * it is hidden.
   */
  fitLines() {
    if (!this.list.clientWidth) return;
    const lines = [...this.list.querySelectorAll(".label, .match")];
    for (const line of lines) line.classList.remove("whole");
    const context = (this.measure ||= document.createElement("canvas").getContext("2d"));
    const titles = new Map(); // the text a cut title shows → its labels
    const whole = new Set(); // measured first, then changed (one layout)
    for (const line of lines) {
      if (line.scrollWidth <= line.clientWidth) continue; // not cut
      context.font = getComputedStyle(line).font;
      const room = line.clientWidth - context.measureText("…").width; // before the ellipsis
      const end = line.getBoundingClientRect().left + room;
      if ([...line.querySelectorAll("mark")].some((mark) => mark.getBoundingClientRect().right > end + 1)) whole.add(line);
      if (!line.classList.contains("label")) continue;
      // The longest start of the title that fits before the ellipsis: what the line shows.
      const text = line.textContent;
      let fits = 0;
      for (let low = 0, high = text.length; low <= high; ) {
        const middle = (low + high) >> 1;
        if (context.measureText(text.slice(0, middle)).width <= room) [fits, low] = [middle, middle + 1];
        else high = middle - 1;
      }
      const shown = text.slice(0, fits);
      titles.set(shown, [...(titles.get(shown) || []), line]);
    }
    for (const same of titles.values()) {
      // Identical titles are told apart by their id instead.
      if (new Set(same.map((label) => label.textContent)).size > 1) for (const label of same) whole.add(label);
    }
    for (const line of whole) line.classList.add("whole");
  }

  titleOf(conversation) {
    return conversation.title || "New conversation";
  }

  item(conversation, { words, twin }) {
    const current = conversation.id === this.currentId();
    const running = Boolean(conversation.active);
    const title = this.titleOf(conversation);
    const when = new Date(conversation.last_activity || conversation.created || Date.now());
    const waiting = this.waiting(conversation);
    const match = conversation.match;
    return el(
      "li",
      { dataset: { conversationId: conversation.id }, class: waiting.length ? "waiting" : null },
      el(
        "a",
        { href: `/c/${conversation.id}/`, "aria-current": current ? "page" : null },
        el(
          "span",
          { class: "item-line" },
          running ? el("span", { class: "running-dot", title: "The agent is working", "aria-label": "running" }) : null,
          el("span", { class: "label" }, ...highlighted(title, words)),
          el("time", { class: "when", datetime: when.toISOString(), title: when.toLocaleString() }, timeFormat.format(when)),
        ),
        twin ? el("span", { class: "item-id muted", title: "Start of the conversation's id" }, `#${conversation.id.slice(0, 6)}`) : null,
        waiting.length ? this.waitingBadge(waiting) : null,
        match && match.field !== "title"
          ? el("span", { class: "match", title: match.field === "prompt" ? "In a prompt" : "In an answer" }, ...highlighted(match.text, words))
          : null,
      ),
    );
  }

  /** The conversation's approvals still within their deadline. */
  waiting(conversation) {
    const now = Date.now();
    return (conversation.pending_approvals || []).filter((a) => new Date(a.expires_at).getTime() > now);
  }

  waitingBadge(waiting) {
    const soonest = Math.min(...waiting.map((a) => new Date(a.expires_at).getTime()));
    const count = waiting.length > 1 ? ` (${waiting.length})` : "";
    return el(
      "span",
      { class: "waiting-badge", dataset: { deadline: String(soonest) } },
      `Waiting for you${count} · `,
      el("span", { class: "time-left" }, formatCountdown((soonest - Date.now()) / 1000)),
    );
  }

  tick() {
    let expired = false;
    for (const badge of this.list.querySelectorAll(".waiting-badge")) {
      const left = (Number(badge.dataset.deadline) - Date.now()) / 1000;
      if (left <= 0) expired = true;
      else badge.querySelector(".time-left").textContent = formatCountdown(left);
    }
    if (expired) this.render();
  }

  /** What this page knows first about the open conversation (its socket, a rename). */
  note(conversationId, facts) {
    const known = this.conversations.get(conversationId);
    if (!known) {
      this.refresh();
      return;
    }
    if (facts.title !== undefined) known.title = facts.title;
    if (facts.active !== undefined) known.active = facts.active;
    this.render();
  }
}
