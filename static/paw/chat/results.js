// What a tool call gave back, for the person: its output (monospace), a run_sql result or
// a DataFrame as a table with its row count (the SQL statement shown, highlighted), and
// the images and Plotly charts it made, shown in the transcript at the call.
//
// Everything comes from paw-agent's `notify tool` line (docs/runtime.md, capability
// `tool_output`); a runtime without those keys (python-agent-harness) shows its summary.

import { el, formatNumber } from "./dom.js";

const IMAGE = /\.(png|jpe?g|gif|webp)$/i;
const PLOTLY = /\.plotly\.json$/i;
const SQL_KEYWORDS = new Set(
  (
    "select from where group by order having limit offset join left right inner outer full cross on as and or not " +
    "in is null like between case when then else end with union all distinct insert into values update set delete " +
    "create table view drop alter explain asc desc count sum avg min max over partition"
  ).split(" "),
);

/** A cell's value as text: null as an empty cell, numbers in the reader's locale. */
function cellText(value) {
  if (value === null || value === undefined) return "";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : String(value);
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

/**
 * A result table: `{columns, rows, row_count, truncated}` → a captioned <table>
 * ("3 rows", "first 100 of 6,433 rows").
 */
export function resultTable(result, label) {
  const columns = Array.isArray(result.columns) ? result.columns : [];
  const rows = Array.isArray(result.rows) ? result.rows : [];
  const total = Number.isFinite(result.row_count) ? result.row_count : rows.length;
  const count =
    rows.length < total
      ? `first ${formatNumber(rows.length)} of ${formatNumber(total)} rows`
      : `${formatNumber(total)} row${total === 1 ? "" : "s"}`;
  const head = el("thead", {}, el("tr", {}, ...columns.map((name) => el("th", { scope: "col" }, String(name)))));
  const body = el(
    "tbody",
    {},
    ...rows.map((row) =>
      el(
        "tr",
        {},
        ...(Array.isArray(row) ? row : []).map((value) =>
          el("td", { class: typeof value === "number" ? "number" : null }, cellText(value)),
        ),
      ),
    ),
  );
  return el(
    "div",
    { class: "result-table", dataset: { rowCount: String(total) } },
    el("table", {}, el("caption", {}, label ? `${label} · ${count}` : count), head, body),
  );
}

/**
 * "✓ verified query: <title>": the run's result ran a verified example's SQL (PAW decides
 * it on the server: `result.verified`, docs/data.md "Verified examples").
 * @param {{id: number, title: string, datasource: string, verified_at: string}} verified
 */
export function verifiedBadge(verified) {
  const day = verified.verified_at ? String(verified.verified_at).slice(0, 10) : "";
  const about = `A verified example of ${verified.datasource}${day ? `, verified on ${day}` : ""}`;
  return el(
    "p",
    { class: "verified-query", role: "note", title: about, dataset: { exampleId: String(verified.id) } },
    "✓ verified query: ",
    el("strong", {}, String(verified.title || "")),
  );
}

/**
 * What paw-agent's check before running found (`sql_check`: `{ok, code, message, name}`),
 * in words for a tool row: "checked: unknown column `p.price`" (the name as code).
 */
export function checkWords(check) {
  const message = typeof check.message === "string" ? check.message : "";
  const name = typeof check.name === "string" ? check.name : "";
  const at = name ? message.lastIndexOf(name) : -1;
  if (at < 0) return ["checked: ", message];
  return ["checked: ", message.slice(0, at), el("code", {}, name), message.slice(at + name.length)];
}

/** A SQL statement with its keywords, strings and numbers marked (class names only). */
export function highlightSql(sql) {
  const code = el("code", { class: "language-sql" });
  const pattern = /('(?:[^']|'')*'|"(?:[^"]|"")*"|--[^\n]*|\b\d+(?:\.\d+)?\b|\b[A-Za-z_][A-Za-z_0-9]*\b)/g;
  let last = 0;
  for (const match of String(sql).matchAll(pattern)) {
    const token = match[0];
    if (match.index > last) code.append(sql.slice(last, match.index));
    let cls = null;
    if (token.startsWith("'") || token.startsWith('"')) cls = token.startsWith("'") ? "sql-string" : null;
    else if (token.startsWith("--")) cls = "sql-comment";
    else if (/^\d/.test(token)) cls = "sql-number";
    else if (SQL_KEYWORDS.has(token.toLowerCase())) cls = "sql-keyword";
    code.append(cls ? el("span", { class: cls }, token) : token);
    last = match.index + token.length;
  }
  if (last < sql.length) code.append(sql.slice(last));
  return el("pre", { class: "tool-sql" }, code);
}

/**
 * Staff only: a form that saves a run_sql statement as an example of its datasource (the
 * question in `title`, prefilled with the run's prompt). PAW runs it read-only first; a
 * failing one is refused with the database's error, shown here.
 * @param {{datasource: string, sql: string}} result
 * @param {string} question
 * @param {(entry: {datasource: string, title: string, sql: string}) => Promise<object>} save
 */
export function saveExampleForm(result, question, save) {
  const input = el("input", { type: "text", maxlength: 300, required: true, value: question || "", "aria-label": "The question this SQL answers" });
  const button = el("button", { type: "submit" }, "Save as an example");
  const status = el("span", { class: "save-status muted small", role: "status" });
  const form = el("form", { class: "save-example" }, el("label", {}, "Question ", input), " ", button, " ", status);
  // Saved once: a changed question may be saved as another example.
  input.addEventListener("input", () => {
    button.disabled = false;
    delete form.dataset.saved;
    status.textContent = "";
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    button.disabled = true;
    status.textContent = "Checking the SQL…";
    try {
      await save({ datasource: result.datasource, title: input.value.trim(), sql: result.sql });
      status.textContent = `Saved as an example of ${result.datasource}.`;
      form.dataset.saved = "";
    } catch (error) {
      status.textContent = `Not saved: ${error.message}`;
      button.disabled = false;
    }
  });
  return form;
}

/** The output blocks of a call: stdout, stderr and error, each only when not empty. */
export function outputBlocks(output, { skipStdout = false } = {}) {
  if (!output || typeof output !== "object") return [];
  const blocks = [];
  const add = (text, cls, label) => {
    if (typeof text !== "string" || !text.trim()) return;
    blocks.push(el("div", { class: `tool-output ${cls}` }, el("span", { class: "output-label" }, label), el("pre", {}, text.replace(/\n+$/, ""))));
  };
  if (!skipStdout) add(output.stdout, "stdout", "Output");
  add(output.stderr, "stderr", "Errors and warnings (stderr)");
  add(output.error, "error", "Error");
  return blocks;
}

let plotlyLoading = null;

/** plotly.js, served by PAW (`config.plotlyUrl`), loaded once on first use. */
function loadPlotly(url) {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  if (!url) return Promise.reject(new Error("plotly.js is not available on this server"));
  if (!plotlyLoading) {
    plotlyLoading = new Promise((resolve, reject) => {
      const script = el("script", { src: url });
      script.addEventListener("load", () => (window.Plotly ? resolve(window.Plotly) : reject(new Error("plotly.js did not start"))));
      script.addEventListener("error", () => {
        plotlyLoading = null;
        reject(new Error("plotly.js did not load"));
      });
      document.head.append(script);
    });
  }
  return plotlyLoading;
}

function imageFigure(path, url) {
  const full = `${url}?inline=1`;
  const image = el("img", { src: full, alt: `${path} (made by the agent)`, loading: "lazy" });
  const link = el("a", { href: full, target: "_blank", rel: "noopener", title: `Open ${path} full size` }, image);
  const figure = el("figure", { class: "tool-image", dataset: { path } }, link, el("figcaption", {}, path));
  image.addEventListener("error", () => {
    link.replaceWith(el("p", { class: "muted small" }, "This image is no longer in the workspace."));
  });
  return figure;
}

/**
 * An interactive Plotly chart from a `.plotly.json` artifact; when it cannot be drawn
 * (no plotly.js, a broken file) the PNG of the same name is shown instead, if there is one.
 */
function chartFigure(path, url, fallbackUrl, plotlyUrl) {
  const plot = el("div", { class: "plotly-chart", role: "img", "aria-label": `Interactive chart ${path}` });
  const figure = el("figure", { class: "tool-chart", dataset: { path, state: "loading" } }, plot, el("figcaption", {}, path));
  (async () => {
    try {
      const response = await fetch(url, { credentials: "same-origin" });
      if (!response.ok) throw new Error(`the chart file answered ${response.status}`);
      const spec = await response.json();
      const Plotly = await loadPlotly(plotlyUrl);
      const layout = { ...(spec.layout || {}), autosize: true };
      delete layout.width;
      await Plotly.newPlot(plot, spec.data || [], layout, { responsive: true, displaylogo: false });
      figure.dataset.state = "drawn";
    } catch (error) {
      figure.dataset.state = "fallback";
      const note = el("p", { class: "muted small" }, `The chart cannot be shown here (${error.message}).`);
      if (!fallbackUrl) {
        plot.replaceChildren(note);
        return;
      }
      const picture = el("img", { src: `${fallbackUrl}?inline=1`, alt: `${path} (picture of the chart)` });
      picture.addEventListener("error", () => picture.replaceWith(note));
      plot.replaceChildren(picture);
    }
  })();
  return figure;
}

/**
 * The images and charts among `files` (paths the call wrote), as figures for the
 * transcript. `artifactUrl(path)` → the artifact's address.
 */
export function mediaFigures(files, artifactUrl, plotlyUrl) {
  if (!Array.isArray(files) || !artifactUrl) return [];
  const paths = files.filter((path) => typeof path === "string");
  const charts = paths.filter((path) => PLOTLY.test(path));
  const chartStems = new Set(charts.map((path) => path.replace(PLOTLY, "")));
  const figures = [];
  for (const path of paths) {
    if (PLOTLY.test(path)) {
      const stem = path.replace(PLOTLY, "");
      const png = paths.find((other) => other === `${stem}.png`);
      figures.push(chartFigure(path, artifactUrl(path), png ? artifactUrl(png) : artifactUrl(`${stem}.png`), plotlyUrl));
    } else if (IMAGE.test(path) && !chartStems.has(path.replace(IMAGE, ""))) {
      figures.push(imageFigure(path, artifactUrl(path)));
    }
  }
  return figures;
}
