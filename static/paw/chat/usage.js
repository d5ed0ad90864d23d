// The usage badge: tokens of the run going on (or the last one) and of this month,
// against the monthly budget when there is one (GET /api/usage); the budgets of your
// teams in its tooltip, and in its level (the fullest budget counts).

import { api } from "./api.js";
import { formatNumber } from "./dom.js";

export class UsageBadge {
  constructor(element) {
    this.element = element;
    this.run = null; // {input, output}
    this.month = null; // {used, limit}
    this.teams = []; // [{name, used_this_month, monthly_limit}]
  }

  async refresh() {
    try {
      const report = await api("GET", "/api/usage");
      this.month = { used: report.budget.used_this_month, limit: report.budget.monthly_limit };
      this.teams = report.budget.teams || [];
    } catch {
      return;
    }
    this.render();
  }

  setRun(usage) {
    this.run = usage;
    this.render();
  }

  render() {
    const parts = [];
    if (this.run) parts.push(`This run: ${formatNumber((this.run.input || 0) + (this.run.output || 0))}`);
    if (this.month) {
      const { used, limit } = this.month;
      parts.push(`This month: ${formatNumber(used)}${limit ? ` of ${formatNumber(limit)}` : ""} tokens`);
      const shares = [limit ? used / limit : 0, ...this.teams.map((t) => t.used_this_month / t.monthly_limit)];
      const share = Math.max(...shares);
      this.element.dataset.level = share >= 1 ? "exhausted" : share >= 0.8 ? "high" : "";
    }
    this.element.textContent = parts.join(" · ");
    const teams = this.teams.map(
      (t) => `Team ${t.name}: ${formatNumber(t.used_this_month)} of ${formatNumber(t.monthly_limit)} tokens this month`,
    );
    if (teams.length) this.element.title = teams.join("\n");
    else this.element.removeAttribute("title");
  }
}
