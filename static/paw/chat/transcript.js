// The conversation as the person reads it: prompts, streamed text, tool rows, todos,
// approvals, errors and the final answers, built from the stored events in cursor order.
//
// Everything shown comes from the runtime's lines (replayed on every page load, then
// live), from `run.status` messages, and from the run list (the answers rendered from
// Markdown and sanitized by the server). The same events always give the same page, so
// a reload mid-run shows the full text once.

import { el, formatCall, formatNumber } from "./dom.js";
import { checkWords, highlightSql, mediaFigures, outputBlocks, resultTable, saveExampleForm, verifiedBadge } from "./results.js";

const STATUS_TEXT = {
  queued: "Waiting for the agent…",
  starting: "Starting the agent…",
  running: "Working…",
  done: "Done",
  error: "Failed",
  cancelled: "Cancelled",
};

// Plain words for the error codes of runs (PROTOCOL.md, docs/runtime.md, PAW's own).
const ERROR_TEXT = {
  auth: "The model provider refused the API key.",
  budget: "The agent reached its limit of tool rounds for one request.",
  timeout: "The run took too long and was stopped.",
  context: "The conversation no longer fits in the model's context.",
  no_answer: "The model gave an empty answer.",
  budget_exceeded: "The token budget ran out, so the run was stopped.",
  policy_violation: "PAW stopped the agent: it tried a risky action without your approval.",
  sandbox_exited: "The agent's sandbox stopped unexpectedly.",
  worker_lost: "The server running the agent went away.",
  unknown: "", // its message says it; a hint follows
};

// Codes whose message says it all, in words that differ by case: a policy violation on a
// gated runtime (paw-agent) was stopped before it acted; on an ungated one
// (python-agent-harness) the call "ran without asking", and the message says so.
const OWN_WORDS = new Set(["policy_violation"]);

const APPROVAL_TEXT = {
  pending: "Waiting for your decision",
  approved: "Approved",
  declined: "Declined",
  answered: "Answered",
  expired: "No answer in time",
  cancelled: "Withdrawn (the run ended)",
};

const DECIDED_BY_TEXT = { user: "by you", auto: "automatically (auto-approve)", timeout: "", system: "" };

/**
 * A short argument repr as it was written ('import os\nimport pandas…'): the text inside
 * the quotes with its escapes turned back into characters, for reading.
 */
function readable(value) {
  if (typeof value !== "string") return JSON.stringify(value, null, 2);
  const quoted = value.match(/^(['"])([\s\S]*?)\1?(…)?$/);
  if (!quoted) return value;
  const text = quoted[2].replace(/\\(n|t|r|'|"|\\)/g, (_, c) => ({ n: "\n", t: "\t", r: "", "'": "'", '"': '"', "\\": "\\" })[c]);
  return quoted[3] ? `${text}…` : text;
}

/** "the worker restarted" → "The worker restarted." (a message shown after a sentence). */
function sentence(text) {
  const trimmed = String(text).trim();
  const capital = trimmed.charAt(0).toUpperCase() + trimmed.slice(1);
  return /[.!?…:]$/.test(capital) ? capital : `${capital}.`;
}

/**
 * A tool call's arguments as a list: each name, then its value as text. ``raw``: the
 * values as given (paw-agent's ``input``); otherwise short reprs, made readable.
 */
function argumentList(args, raw) {
  const text = (value) => (raw ? (typeof value === "string" ? value : JSON.stringify(value, null, 2)) : readable(value));
  return el(
    "dl",
    { class: "tool-args" },
    ...Object.entries(args).flatMap(([key, value]) => [
      el("dt", { dataset: { arg: key } }, key),
      el("dd", { dataset: { arg: key } }, el("pre", {}, text(value))),
    ]),
  );
}

/** One run: the prompt, then the agent's steps, the answer, errors and a footer. */
class RunView {
  constructor(transcript, runId) {
    this.transcript = transcript;
    this.runId = runId;
    this.status = "";
    this.answerHtml = null;
    this.answerText = "";
    this.resultSeen = false;
    this.verified = null; // {sql, verified} when the run's result is a verified query
    this.cancelled = false;
    this.lastText = null;
    this.texts = [];
    this.tools = [];
    this.todos = null;
    this.usage = null;
    this.provider = "";
    this.model = "";

    this.promptEl = el("div", { class: "prompt-bubble", hidden: true });
    this.promptText = el("span");
    this.promptEl.append(el("span", { class: "visually-hidden" }, "You: "), this.promptText);
    this.stepsEl = el("div", { class: "steps" });
    this.answerEl = el("div", { class: "answer", hidden: true });
    this.lineageEl = el("p", { class: "lineage", hidden: true });
    this.errorsEl = el("div", { class: "run-errors" });
    this.agentEl = el("div", { class: "agent", role: "group", "aria-label": "The agent" }, this.stepsEl, this.answerEl, this.lineageEl, this.errorsEl);
    this.statusEl = el("span", { class: "status" });
    this.modelEl = el("span", { class: "model" });
    this.tokensEl = el("span", { class: "tokens" });
    this.footerEl = el("div", { class: "run-footer" }, this.statusEl, this.modelEl, this.tokensEl);
    this.element = el("article", { class: "run", dataset: { runId } }, this.promptEl, this.agentEl, this.footerEl);
  }

  get active() {
    return ["queued", "starting", "running"].includes(this.status);
  }

  setPrompt(text) {
    if (!text || !this.promptEl.hidden) return;
    this.promptText.textContent = text;
    this.promptEl.hidden = false;
  }

  /** The images sent to the model with the prompt (workspace paths), under it. */
  setAttachments(paths) {
    if (!paths || !paths.length || this.promptEl.querySelector(".prompt-attachments")) return;
    this.promptEl.append(el("span", { class: "prompt-attachments" }, `Images sent to the model: ${paths.join(", ")}`));
  }

  /**
   * A run's state (from the run list or a `run.status` message; `guessed`: from the
   * runtime's own result line, which PAW's final word replaces: a run PAW ended itself —
   * a policy violation, a budget — reads "cancelled" there but is an error).
   */
  setStatus({ status, errors, usage, model, provider, result, lineage }, { guessed = false } = {}) {
    // What the answer rests on: a run's `result.lineage`, a `run.status` message's `lineage`.
    if (lineage !== undefined) this.setLineage(lineage);
    else if (result !== undefined) this.setLineage(result && result.lineage);
    // Messages can cross (a "queued" announced after the worker's "starting"): a run
    // never goes back, and an ended run stays ended.
    const order = { queued: 0, starting: 1, running: 2 };
    const ended = this.status && !(this.status in order);
    const backwards = status in order && this.status in order && order[status] < order[this.status];
    const final = ended && this.statusGuessed && !guessed && status && !(status in order);
    const asked = status;
    if (status && ((ended && !final) || backwards)) status = undefined;
    if (status) {
      this.status = status;
      this.statusGuessed = guessed;
      this.statusEl.textContent = STATUS_TEXT[status] || status;
      this.statusEl.dataset.status = status;
      this.element.dataset.status = status;
      if (!this.active) this.settleTools(status === "cancelled" ? "cancelled" : "done");
    }
    // The errors go with the status they explain (not a guess's after PAW's final word).
    if (errors && (status || !asked)) this.setErrors(errors);
    if (usage && (usage.input || usage.output)) this.setUsage(usage);
    if (provider !== undefined) this.provider = provider || "";
    if (model !== undefined) this.model = model || "";
    const demo = this.transcript.demoProvider && this.provider === this.transcript.demoProvider;
    this.modelEl.textContent = demo ? "scripted demo" : this.model;
  }

  /**
   * "Based on: `orders`, `customers`; doc Revenue; example Monthly revenue" under the
   * answer: the tables its statements read, then the docs and examples it was given or
   * retrieved (PAW's own record, docs/data.md). Nothing when it names none of them.
   */
  setLineage(lineage) {
    const parts = [];
    const tables = (lineage && Array.isArray(lineage.tables) && lineage.tables) || [];
    if (tables.length) parts.push(tables.flatMap((name, i) => [...(i ? [", "] : []), el("code", {}, String(name))]));
    const entries = (lineage && Array.isArray(lineage.entries) && lineage.entries) || [];
    for (const [kind, one, many] of [["doc", "doc", "docs"], ["example", "example", "examples"]]) {
      const titles = entries.filter((entry) => entry && entry.kind === kind).map((entry) => String(entry.title || ""));
      if (!titles.length) continue;
      parts.push([`${titles.length === 1 ? one : many} `, ...titles.flatMap((title, i) => [...(i ? [", "] : []), el("em", {}, title)])]);
    }
    this.lineageEl.replaceChildren(
      ...(parts.length ? ["Based on: ", ...parts.flatMap((part, i) => [...(i ? ["; "] : []), ...part])] : []),
    );
    this.lineageEl.hidden = !parts.length;
  }

  setUsage(usage) {
    this.usage = usage;
    const tokens = (usage.input || 0) + (usage.output || 0);
    this.tokensEl.textContent = `${formatNumber(tokens)} tokens${usage.estimated ? " (estimated)" : ""}`;
  }

  setErrors(errors) {
    this.errorsEl.replaceChildren(
      ...errors.map((error) => {
        const known = ERROR_TEXT[error.code];
        const message = error.message && error.message !== known ? sentence(error.message) : "";
        if (error.code === "unknown" && message) {
          const hint = " Check that the model provider can be reached and that its key is valid.";
          return el("p", { class: "run-error", role: "alert" }, message, hint);
        }
        if (OWN_WORDS.has(error.code) && message) {
          return el("p", { class: "run-error", role: "alert" }, message);
        }
        return el("p", { class: "run-error", role: "alert" }, known || "Something went wrong.", message ? ` ${message}` : "");
      }),
    );
  }

  /** Add a step (a text block, a tool row, a notice …) after the earlier ones. */
  add(step) {
    this.stepsEl.append(step);
    if (!step.classList.contains("agent-text")) this.lastText = null;
    return step;
  }

  delta(text) {
    if (!text) return;
    if (!this.lastText) {
      // New text means the tools before it have finished, also for runtimes that do not
      // report each tool's end (python-agent-harness).
      this.settleTools("done");
      this.lastText = el("div", { class: "agent-text" });
      this.texts.push(this.lastText);
      this.stepsEl.append(this.lastText);
    }
    this.lastText.textContent += text;
  }

  toolCalls(calls) {
    for (const call of calls || []) {
      if (!call || typeof call.name !== "string") continue;
      // paw-agent adds the whole values ("input") to the protocol's short reprs ("args").
      const full = call.input && typeof call.input === "object" ? call.input : null;
      // The row's label shows code as it reads, line breaks and all (not as `\n` escapes).
      const shown = full || Object.fromEntries(Object.entries(call.args || {}).map(([k, v]) => [k, readable(v)]));
      this.addTool(call.name, formatCall(call.name, shown), "waiting", full || call.args, Boolean(full));
    }
  }

  addTool(name, label, state, args = null, raw = false) {
    const stateEl = el("span", { class: "tool-state" });
    const icon = el("span", { class: "spinner", "aria-hidden": "true" });
    const callEl = el("span", { class: label.includes("\n") ? "call multiline" : "call", title: label }, label);
    const summary = el("summary", {}, icon, callEl, stateEl);
    const details = args && Object.keys(args).length ? argumentList(args, raw) : el("p", { class: "muted small" }, "No arguments shown.");
    const body = el("div", { class: "tool-body" }, details);
    const element = el("details", { class: "tool", dataset: { tool: name } }, summary, body);
    const tool = { name, element, stateEl, icon, body, state: "" };
    this.tools.push(tool);
    this.add(element);
    this.setToolState(tool, state);
    return tool;
  }

  setToolState(tool, state, summaryText = "") {
    tool.state = state;
    tool.element.dataset.state = state;
    const words = {
      waiting: "starting…",
      running: "running…",
      ok: "ok",
      error: "error",
      declined: "not done: declined",
      checked: "not run: checked",
      done: "done",
      cancelled: "cancelled",
    };
    tool.stateEl.textContent = words[state] || state;
    tool.icon.hidden = !["waiting", "running"].includes(state);
    if (summaryText) tool.body.append(el("pre", { class: "tool-summary" }, summaryText));
  }

  toolRunning(name) {
    const tool = this.tools.find((t) => t.name === name && t.state === "waiting") || this.addTool(name, name, "waiting");
    this.setToolState(tool, "running");
  }

  toolDone(data) {
    if (!data || typeof data !== "object") return;
    const summary = typeof data.summary === "string" ? data.summary : "";
    const declined = !data.ok && /declined by the user/i.test(summary);
    const tool =
      this.tools.find((t) => t.name === data.name && ["running", "waiting"].includes(t.state)) ||
      this.addTool(data.name || "tool", data.name || "tool", "running");
    // paw-agent's check before running sent the statement back unrun ("checked: unknown
    // column `p.price`"), or let it run unchecked (its EXPLAIN too slow, its retries used).
    const check = data.sql_check && typeof data.sql_check === "object" ? data.sql_check : null;
    const sentBack = Boolean(check && check.ok === false);
    this.setToolState(tool, sentBack ? "checked" : data.ok ? "ok" : declined ? "declined" : "error", summary);
    if (sentBack) tool.stateEl.replaceChildren(...checkWords(check));
    else if (check && check.ok === null && typeof check.message === "string") {
      tool.stateEl.append(el("span", { class: "tool-check" }, ` · ${check.message}`));
    }
    this.showResult(tool, data);
  }

  /**
   * What the call gave back (paw-agent's `tool_output`): in the opened row, a run_sql
   * result or a DataFrame as a table, then the output; after the row, in the transcript,
   * the images and charts it made.
   */
  showResult(tool, data) {
    const sql = data.sql_result && typeof data.sql_result === "object" ? data.sql_result : null;
    const table = sql || (data.table && typeof data.table === "object" ? data.table : null);
    const parts = [];
    if (sql && sql.sql) parts.push(highlightSql(sql.sql));
    if (table) parts.push(resultTable(table, sql ? sql.datasource : "DataFrame"));
    if (sql && sql.sql && sql.datasource && this.transcript.saveExample) {
      parts.push(saveExampleForm(sql, this.promptText.textContent, this.transcript.saveExample));
    }
    // A table is the stdout of a run_sql (its text for the model): not shown twice.
    parts.push(...outputBlocks(data.output, { skipStdout: Boolean(sql) }));
    if (parts.length) {
      tool.body.querySelector(".tool-summary")?.remove();
      tool.body.append(el("div", { class: "tool-result" }, ...parts));
    }
    tool.sql = sql && sql.sql ? String(sql.sql) : null;
    this.paintVerified(tool);
    // The statement is shown highlighted above its rows: not a second time, plain, among
    // the call's arguments (a failed run_sql has no result and keeps it there).
    const query = sql && sql.sql ? tool.body.querySelector('.tool-args dd[data-arg="query"]') : null;
    if (query && query.textContent.trim() === String(sql.sql).trim()) {
      for (const node of tool.body.querySelectorAll('.tool-args [data-arg="query"]')) node.remove();
    }
    const figures = mediaFigures(data.files, this.transcript.artifactUrl, this.transcript.plotlyUrl);
    if (figures.length) {
      const media = el("div", { class: "tool-media", dataset: { tool: tool.name } }, ...figures);
      tool.element.after(media);
      this.lastText = null;
    }
  }

  /** End the rows still going (the run ended, or the model is talking again). */
  settleTools(state) {
    for (const tool of this.tools) {
      if (["waiting", "running"].includes(tool.state)) this.setToolState(tool, state);
    }
  }

  setTodos(items) {
    if (!Array.isArray(items)) return;
    if (!this.todos) {
      this.todos = el("section", { class: "todos", "aria-label": "The agent's plan" }, el("h3", {}, "Plan"), el("ul"));
      this.add(this.todos);
    }
    this.todos.querySelector("ul").replaceChildren(
      ...items.map((item) => {
        const content = item && typeof item === "object" ? String(item.content ?? item.text ?? "") : String(item);
        const status = item && typeof item === "object" ? String(item.status || "") : "";
        const mark = { completed: "✓ ", in_progress: "… " }[status] || "";
        return el("li", { dataset: { status } }, mark, content);
      }),
    );
  }

  notice(text, className = "notice") {
    this.add(el("p", { class: className }, text));
  }

  retry(data) {
    if (data && data.partial && this.lastText) {
      this.lastText.dataset.superseded = "";
      this.lastText.title = "This text was cut off by a failed model call; the retry follows.";
    }
    const when = data && data.delay ? ` in ${Math.round(data.delay * 10) / 10} s` : "";
    const attempt = data && data.attempt ? ` (attempt ${data.attempt + 1} of ${data.max_attempts || "?"})` : "";
    this.notice(`The model call failed${data && data.reason ? ` (${data.reason})` : ""}; retrying${when}${attempt}.`);
  }

  approvalStep(data) {
    const key = `${this.runId}:${data.ask_id}`;
    const body =
      data.kind === "confirm"
        ? [el("span", {}, "The agent asked to do this:"), el("pre", {}, data.prompt || "")]
        : [el("span", {}, "The agent asked: "), ...(data.questions || []).map((q) => el("q", {}, q.question || ""))];
    const statusEl = el("span", { class: "approval-status" });
    const step = el("div", { class: "step-approval", dataset: { kind: data.kind, status: "pending" } }, ...body, statusEl);
    this.add(step);
    this.transcript.approvalSteps.set(key, { step, statusEl, kind: data.kind });
    this.transcript.paintApproval(key);
  }

  /** The run's `result` from PAW (the run API): its `verified` marks the call that ran it. */
  setResult(result) {
    const verified = result && result.verified && typeof result.verified === "object" ? result.verified : null;
    this.verified = verified ? { sql: String(result.sql || ""), verified } : null;
    for (const tool of this.tools) this.paintVerified(tool);
  }

  /** A run_sql row whose statement is the run's verified result: the badge on its table,
   * and a mark on the row's summary line (seen without opening it). */
  paintVerified(tool) {
    if (!this.verified || !tool.sql || tool.sql !== this.verified.sql || tool.element.dataset.verified !== undefined) return;
    tool.element.dataset.verified = "";
    const badge = verifiedBadge(this.verified.verified);
    const result = tool.body.querySelector(".tool-result");
    if (result) result.prepend(badge);
    else tool.body.append(badge);
    tool.stateEl.before(el("span", { class: "verified-mark", title: badge.textContent }, "✓ verified"));
  }

  result(event) {
    this.resultSeen = true;
    this.cancelled = Boolean(event.cancelled);
    this.answerText = event.answer || "";
    this.settleTools(this.cancelled ? "cancelled" : "done");
    if (event.usage) this.setUsage(event.usage);
    if (event.model) this.setStatus({ model: event.model });
    if (this.active) {
      // The run's own status follows (PAW may still end it otherwise, e.g. over budget).
      const failed = Array.isArray(event.errors) && event.errors.length;
      this.setStatus(
        { status: this.cancelled ? "cancelled" : failed ? "error" : "done", errors: event.errors || [] },
        { guessed: true },
      );
    }
    if (this.answerHtml !== null) this.showAnswer();
    else if (this.answerText) this.transcript.fetchAnswer(this);
  }

  /** The server-rendered answer replaces the streamed text it repeats. */
  setAnswerHtml(html) {
    this.answerHtml = html || "";
    this.showAnswer();
  }

  /**
   * Show the rendered answer once, where it belongs. The answer repeats the streamed text
   * of the last round: when that text is the run's last step it is replaced by the
   * rendered answer; when other steps followed it (a run cancelled while it waited for an
   * approval) the text stays where it is and the answer is not shown a second time.
   */
  showAnswer() {
    if (!this.answerHtml) return;
    this.answerEl.innerHTML = this.answerHtml; // rendered from Markdown and sanitized by PAW (nh3)
    this.answerEl.hidden = false;
    if (!this.resultSeen) return; // the run's lines are still being replayed
    const last = this.texts[this.texts.length - 1];
    for (const text of this.texts) text.hidden = false;
    if (!last || last.textContent.trim() !== this.answerText.trim()) return;
    if (last === this.lastText) last.hidden = true;
    else this.answerEl.hidden = true;
  }
}

export class Transcript {
  /**
   * @param {HTMLElement} root the scrolling container
   * @param {{fetchRun: (runId: string) => Promise<object>, demoProvider: string|null, onChange: () => void,
   *          artifactUrl: (path: string) => string, plotlyUrl: string,
   *          saveExample: ((entry: {datasource: string, title: string, sql: string}) => Promise<object>)|null}} options
   *   `artifactUrl(path)`: the address of an artifact of the open conversation;
   *   `plotlyUrl`: where plotly.js is served ("" when it is not); `saveExample`: staff
   *   only, saves a run_sql statement as an example of its datasource.
   */
  constructor(root, { fetchRun, demoProvider, onChange, artifactUrl, plotlyUrl, saveExample }) {
    this.root = root;
    this.fetchRun = fetchRun;
    this.saveExample = saveExample || null;
    this.artifactUrl = artifactUrl;
    this.plotlyUrl = plotlyUrl || "";
    this.demoProvider = demoProvider;
    this.onChange = onChange || (() => {});
    this.runs = new Map();
    this.approvals = new Map(); // "<run id>:<ask id>" → {status, decided_by, answers}
    this.approvalSteps = new Map();
    this.empty = root.querySelector("#transcript-empty");
  }

  run(runId) {
    let view = this.runs.get(runId);
    if (!view) {
      view = new RunView(this, runId);
      this.runs.set(runId, view);
      if (this.empty) this.empty.hidden = true;
      this.root.append(view.element);
    }
    return view;
  }

  /** Runs from the run list, oldest first: prompt, status, errors, usage, answer. */
  seedRuns(runs) {
    for (const run of runs) {
      const view = this.run(run.id);
      view.setPrompt(run.prompt);
      view.setAttachments(run.attachments);
      view.setStatus(run);
      view.answerText = run.answer || "";
      view.setResult(run.result);
      if (!view.active && run.answer_html) view.setAnswerHtml(run.answer_html);
    }
  }

  /** Approvals from the API: how each question or confirm was decided. */
  seedApprovals(approvals) {
    for (const approval of approvals) this.noteApproval(approval);
  }

  noteApproval(approval) {
    if (!approval.ask_id) return;
    const key = `${approval.run_id}:${approval.ask_id}`;
    this.approvals.set(key, { ...(this.approvals.get(key) || {}), ...approval });
    this.paintApproval(key);
  }

  paintApproval(key) {
    const target = this.approvalSteps.get(key);
    const info = this.approvals.get(key);
    if (!target) return;
    const status = (info && info.status) || "pending";
    target.step.dataset.status = status;
    let text = APPROVAL_TEXT[status] || status;
    const by = info && DECIDED_BY_TEXT[info.decided_by];
    if (by && status !== "pending") text += ` ${by}`;
    if (info && status === "answered" && info.answers && info.answers.length) text += `: ${info.answers.join(", ")}`;
    target.statusEl.textContent = ` — ${text}.`;
  }

  /** A `run.event` message: one stored runtime line (or a PAW notice). */
  handleEvent({ run_id: runId, event }) {
    if (!event || typeof event !== "object") return;
    if (!runId) {
      if (event.type === "notice") this.conversationNotice(event.message);
      return;
    }
    const view = this.run(runId);
    this.lastEventRun = view;
    switch (event.type) {
      case "start":
        view.setPrompt(event.prompt);
        view.setAttachments(event.attachments);
        break;
      case "delta":
        view.delta(event.text);
        break;
      case "notify":
        this.handleNotify(view, event.kind, event.data);
        break;
      case "result":
        view.result(event);
        break;
      case "notice":
        view.notice(event.message || "");
        break;
      case "policy_violation":
        view.notice(event.message || ERROR_TEXT.policy_violation, "run-error");
        break;
      default:
        break; // log lines and protocol errors are bookkeeping, not progress
    }
    this.onChange();
  }

  handleNotify(view, kind, data) {
    switch (kind) {
      case "tool_calls":
        view.toolCalls(data);
        break;
      case "tool_running":
        if (typeof data === "string") view.toolRunning(data);
        break;
      case "tool":
        view.toolDone(data);
        break;
      case "todos":
        view.setTodos(Array.isArray(data) ? data : data && data.todos);
        break;
      case "ask":
        if (data && data.ask_id) view.approvalStep(data);
        break;
      case "usage":
        if (data) view.setUsage(data);
        break;
      case "retry":
        view.retry(data);
        break;
      case "error":
        view.notice(typeof data === "string" ? data : "The agent hit an error and carries on.");
        break;
      case "compact":
        view.notice("Older parts of the conversation were summarized to fit the model's context.");
        break;
      default:
        break; // tool_start, context, run_done …: shown through the lines above
    }
  }

  handleStatus(message) {
    const view = this.run(message.run_id);
    view.setStatus(message);
    if (!view.active && view.resultSeen && view.answerHtml === null && view.answerText) this.fetchAnswer(view);
    this.onChange();
  }

  async fetchAnswer(view) {
    if (view.fetching) return;
    view.fetching = true;
    try {
      const run = await this.fetchRun(view.runId);
      if (run.answer_html) view.setAnswerHtml(run.answer_html);
      view.setResult(run.result);
      view.setStatus(run);
    } catch {
      // The streamed text stays on the page; the rendered answer comes with the next load.
    } finally {
      view.fetching = false;
    }
  }

  /** A notice of no run ("the sandbox exited"): after the run it followed in time. */
  conversationNotice(text) {
    if (this.empty) this.empty.hidden = true;
    const notice = el("p", { class: "notice" }, text || "");
    let anchor = this.lastEventRun?.element;
    while (anchor?.nextElementSibling?.classList.contains("notice")) anchor = anchor.nextElementSibling;
    if (anchor) anchor.after(notice);
    else this.root.append(notice);
  }

  activeRun() {
    return [...this.runs.values()].find((view) => view.active) || null;
  }
}
