// The model picker: every provider from GET /api/providers, its models as options;
// inactive providers are shown greyed out with the reason; providers and models your teams
// may not use are not listed (PAW leaves them out). The choice is remembered per
// conversation (PATCH llm_provider / llm_model); "Automatic" leaves it to PAW (your
// default, then the server's, then the first active provider).

import { api } from "./api.js";
import { el } from "./dom.js";

export class ModelPicker {
  /**
   * @param {HTMLSelectElement} select
   * @param {HTMLElement} note where the reason of an inactive provider or an error goes
   * @param {{onChange: (choice: {llm_provider: string, llm_model: string}) => Promise<void>,
   *   demoProvider?: string|null}} options demoProvider: the offline demo's provider name, if offered
   */
  constructor(select, note, { onChange, demoProvider = null }) {
    this.select = select;
    this.note = note;
    this.onChange = onChange;
    this.demoProvider = demoProvider;
    this.providers = [];
    this.userDefault = { llm_provider: "", llm_model: "" };
    this.choice = { llm_provider: "", llm_model: "" };
    this.listeners = [];
    select.addEventListener("change", () => this.changed());
  }

  async load() {
    const [providers, userDefault] = await Promise.all([
      api("GET", "/api/providers"),
      api("GET", "/api/providers/default").catch(() => ({ llm_provider: "", llm_model: "" })),
    ]);
    this.providers = providers.providers;
    this.userDefault = userDefault;
    this.render();
  }

  /** The effective provider name: the choice, your default, else the first active one.
   * A stored choice or default naming a provider the list leaves out (one your teams may
   * no longer use) is passed over, as PAW passes it over when a run starts. */
  effectiveProvider() {
    if (this.listed(this.choice.llm_provider)) return this.choice.llm_provider;
    return this.effectiveProviderWithout();
  }

  /** Whether `name` is a provider of the list (one you may use). */
  listed(name) {
    return Boolean(name) && this.providers.some((p) => p.name === name);
  }

  set(choice) {
    this.choice = { llm_provider: choice.llm_provider || "", llm_model: choice.llm_model || "" };
    this.render();
  }

  render() {
    const automatic = this.providers.find((p) => p.name === this.effectiveProviderWithout());
    // When "Automatic" is the offline demo (nothing else is available), that option is the
    // demo: it is listed once, not a second time as its own group (unless chosen by name).
    const demoIsAutomatic =
      automatic && automatic.name === this.demoProvider && this.choice.llm_provider !== automatic.name;
    const autoLabel = !automatic
      ? "Automatic"
      : demoIsAutomatic
        ? `Automatic: ${automatic.label} (${automatic.default_model || automatic.models[0] || ""})`
        : `Automatic: ${automatic.label}`;
    const options = [el("option", { value: "" }, autoLabel)];
    for (const provider of this.providers) {
      if (demoIsAutomatic && provider.name === this.demoProvider) continue;
      const label = provider.active ? provider.label : `${provider.label} — not available`;
      const group = el("optgroup", { label, disabled: !provider.active });
      const models = provider.models.length ? provider.models : [provider.default_model].filter(Boolean);
      for (const model of models) {
        group.append(
          el("option", { value: JSON.stringify([provider.name, model]), title: provider.reason_if_inactive || null }, model),
        );
      }
      if (!models.length) group.append(el("option", { value: "", disabled: true }, "no models listed"));
      options.push(group);
    }
    this.select.replaceChildren(...options);
    this.select.value = this.choice.llm_provider
      ? JSON.stringify([this.choice.llm_provider, this.choice.llm_model || this.defaultModel(this.choice.llm_provider)])
      : "";
    if (this.select.selectedIndex < 0) this.select.value = "";
    const inactive = this.providers.filter((p) => !p.active);
    this.note.replaceChildren();
    if (!this.providers.some((p) => p.active)) {
      this.note.textContent = `No model provider is available yet. ${inactive[0]?.reason_if_inactive || ""}`;
    } else if (inactive.length) {
      // The reasons are on the options too, but browsers show no tooltips inside a select.
      this.note.append(
        `${inactive.map((p) => p.label).join(", ")}: no key yet — `,
        el("a", { href: "/settings/keys/" }, "add one"),
        ".",
      );
    }
    for (const listener of this.listeners) listener(this.effectiveProvider());
  }

  effectiveProviderWithout() {
    if (this.listed(this.userDefault.llm_provider)) return this.userDefault.llm_provider;
    return this.providers.find((p) => p.active)?.name || "";
  }

  defaultModel(name) {
    return this.providers.find((p) => p.name === name)?.default_model || "";
  }

  async changed() {
    const [provider, model] = this.select.value ? JSON.parse(this.select.value) : ["", ""];
    const previous = this.choice;
    this.choice = { llm_provider: provider, llm_model: model };
    try {
      await this.onChange(this.choice);
      this.note.textContent = "";
      for (const listener of this.listeners) listener(this.effectiveProvider());
    } catch (error) {
      this.choice = previous;
      this.render();
      this.note.textContent = error.message;
    }
  }

  /** Call `listener(providerName)` whenever the effective provider may have changed. */
  onProvider(listener) {
    this.listeners.push(listener);
  }
}
