// The chat page's start-up: builds the parts (sidebar, transcript, files, approvals, the
// model picker, the usage badge), wires them to the REST API and the conversation's
// websocket, and loads the open conversation. What each websocket message does is in
// messages.js, the composer in composer.js, the header's dialogs in dialogs.js.

import { api, apiAll } from "./api.js";
import { ApprovalPanels } from "./approvals.js";
import { AttachmentTray } from "./attachments.js";
import { setupComposer } from "./composer.js";
import { setupDialogs } from "./dialogs.js";
import { setupDrawer } from "./drawer.js";
import { nearBottom } from "./dom.js";
import { DatasourcePicker } from "./datasources.js";
import { setupExports } from "./exports.js";
import { encodePath, FilesPanel } from "./files.js";
import { messageHandlers } from "./messages.js";
import { ModelPicker } from "./models.js";
import { $, base, config, showError, showTitle, state } from "./page.js";
import { setupSharing } from "./sharing.js";
import { Sidebar } from "./sidebar.js";
import { ConversationSocket } from "./socket.js";
import { Transcript } from "./transcript.js";
import { UsageBadge } from "./usage.js";
import { TurnVersions } from "./versions.js";
import { Attention } from "./attention.js";
import { UserSocket } from "./user_socket.js";

const transcriptEl = $("transcript");

// The parts, and the conversation's lifecycle they share (the other modules get `page`).
const page = {
  ensureConversation,
  refreshConversation,
  updateRunControls: () => {},
};

page.transcript = new Transcript(transcriptEl, {
  fetchRun: (runId) => api("GET", `${base()}/runs/${runId}`),
  demoProvider: config.demoProvider,
  artifactUrl: (path) => `${base()}/artifacts/${encodePath(path)}`,
  plotlyUrl: config.plotlyUrl,
  // Staff teach PAW a datasource from the page: a run_sql that answered well becomes an
  // example (POST /api/admin/datasources/{slug}/knowledge, checked read-only there).
  saveExample: config.isStaff
    ? ({ datasource, title, sql }) =>
        api("POST", `/api/admin/datasources/${encodeURIComponent(datasource)}/knowledge`, { kind: "example", title, sql })
    : null,
  onChange: () => {
    page.versions?.refresh();
    keepAtEnd();
    page.updateRunControls();
  },
});
// Edit the last prompt, regenerate the last answer, switch between a turn's versions.
page.versions = new TurnVersions(page.transcript, {
  replace: (runId, prompt) => api("POST", `${base()}/runs`, prompt === null ? { replaces: runId } : { replaces: runId, prompt }),
  onError: (message) => showError(message),
  started: (run) => {
    showError("");
    state.stickToBottom = true;
    const view = page.transcript.run(run.id);
    view.setPrompt(run.prompt);
    view.setStatus(run);
    page.usage.setRun({ input: 0, output: 0 });
    page.sidebar.note(state.conversationId, { active: true });
    page.transcript.onChange();
  },
});
// The transcript stays at its end while the person has not scrolled away from it: when
// it changes, and when an image in it loads after the page scrolled (the charts of a
// reopened conversation load after it is shown, and make it taller). `load` does not
// bubble: it is listened to on its way down.
function keepAtEnd() {
  if (state.stickToBottom) transcriptEl.scrollTop = transcriptEl.scrollHeight;
}
transcriptEl.addEventListener("scroll", () => {
  state.stickToBottom = nearBottom(transcriptEl);
});
transcriptEl.addEventListener(
  "load",
  (event) => {
    if (event.target instanceof HTMLImageElement) keepAtEnd();
  },
  true,
);

page.approvals = new ApprovalPanels($("approvals"), {
  decide: async (approvalId, decision) => {
    if (state.socket && state.socket.send({ type: "agent_confirm_response", approval_id: approvalId, ...decision })) return;
    await api("POST", `/api/approvals/${approvalId}/decision`, decision); // no socket: the API
  },
});

page.picker = new ModelPicker($("model-picker"), $("model-note"), {
  demoProvider: config.demoProvider,
  onChange: async (choice) => {
    if (!state.conversationId) {
      state.pendingChoice = choice;
      return;
    }
    state.conversation = await api("PATCH", base(), choice);
  },
});
page.attachments = new AttachmentTray({ tray: $("attachment-tray"), note: $("attachment-note"), picker: page.picker });

page.files = new FilesPanel({
  chips: $("file-chips"),
  progress: $("upload-progress"),
  artifacts: $("artifact-list"),
  artifactEmpty: $("artifact-empty"),
  maxBytes: config.maxUploadBytes,
  conversationId: () => ensureConversation(),
  currentId: () => state.conversationId,
  onError: (message) => showError(message),
  attachments: page.attachments,
});
$("upload-button").addEventListener("click", () => $("file-input").click());
$("file-input").addEventListener("change", (event) => {
  page.files.add(event.target.files);
  event.target.value = "";
});
page.files.acceptDrops($("main"), $("drop-overlay"));

page.attention = new Attention($("notify-me"));
page.sidebar = new Sidebar($("conversation-list"), $("conversation-list-empty"), () => state.conversationId, {
  search: $("conversation-search"),
  searchNote: $("conversation-search-note"),
  onChange: (conversations) => page.attention.update(conversations),
});
// The conversation list's live feed: every conversation's state, over one socket.
page.userSocket = new UserSocket({
  onMessage: (message) => page.sidebar.onMessage(message),
  onOpen: () => page.sidebar.refresh(),
});
page.userSocket.connect();

page.picker.onProvider((name) => {
  $("demo-banner").hidden = !(config.demoProvider && name === config.demoProvider);
  // With a real provider available, the way out of the demo is the model picker.
  if (page.picker.providers.some((p) => p.active && p.name !== config.demoProvider)) {
    $("demo-next").textContent = "Pick another model above to talk to a real one.";
  }
});

page.datasources = new DatasourcePicker($("datasource-picker"), {
  save: async (slugs) => {
    await ensureConversation();
    state.conversation = await api("PATCH", base(), { datasources: slugs });
    return state.conversation.datasources;
  },
  onError: (message) => showError(message),
});

page.usage = new UsageBadge($("usage-badge"));
page.exports = setupExports();
page.sharing = setupSharing();

page.updateRunControls = setupComposer(page);
setupDialogs(page);
setupDrawer();
const handlers = messageHandlers(page);
const onState = handlers.onState;
function onMessage(message) {
  if (message.type === "run.status") page.versions.note({ id: message.run_id, replaces: message.replaces });
  handlers.onMessage(message);
}

// --- the conversation -------------------------------------------------------------------

/** The open conversation's id; the first upload, message or setting creates one. */
function ensureConversation() {
  if (state.conversationId) return Promise.resolve(state.conversationId);
  if (!state.creating) {
    const body = { ...state.pendingChoice, auto_approve: $("auto-approve").checked };
    state.creating = api("POST", "/api/conversations", body)
      .then((conversation) => {
        opened(conversation);
        return conversation.id;
      })
      .finally(() => {
        state.creating = null;
      });
  }
  return state.creating;
}

function opened(conversation) {
  state.conversationId = conversation.id;
  state.conversation = conversation;
  history.replaceState(null, "", `/c/${conversation.id}/`);
  showTitle(conversation.title);
  $("rename-conversation").hidden = false;
  $("delete-conversation").hidden = false;
  $("forget-memory").hidden = false;
  page.exports.show();
  page.sharing.show();
  page.sidebar.refresh();
  connect();
}

async function refreshConversation() {
  if (!state.conversationId) return;
  try {
    state.conversation = await api("GET", base());
  } catch {
    return;
  }
  showTitle(state.conversation.title);
  page.sidebar.note(state.conversationId, { title: state.conversation.title });
  return state.conversation;
}

function connect() {
  if (state.socket) return;
  transcriptEl.setAttribute("aria-busy", "true"); // the replay is not read out
  state.socket = new ConversationSocket(state.conversationId, { onMessage, onState });
  state.socket.connect();
}

// --- start ------------------------------------------------------------------------------

async function start() {
  const { transcript, files, sidebar, picker, usage, datasources } = page;
  sidebar.refresh();
  usage.refresh();
  const datasourcesLoaded = datasources.load().catch(() => {});
  picker.load().catch((error) => {
    $("model-note").textContent = error.message;
  });
  if (!state.conversationId) {
    $("prompt").focus();
    return;
  }
  try {
    const [conversation, runs, approvalList] = await Promise.all([
      api("GET", base()),
      apiAll(`${base()}/runs?page_size=100`).then((newestFirst) => newestFirst.reverse()),
      apiAll(`${base()}/approvals?page_size=100`),
    ]);
    state.conversation = conversation;
    picker.set(conversation);
    datasourcesLoaded.then(() => datasources.set(conversation));
    $("auto-approve").checked = conversation.auto_approve;
    transcript.seedRuns(runs);
    page.versions.seed(runs);
    transcript.seedApprovals(approvalList);
    const last = runs[runs.length - 1];
    if (last && last.usage) usage.setRun(last.usage);
  } catch (error) {
    showError(error.message);
  }
  files.refresh();
  connect();
  state.stickToBottom = true;
  transcript.onChange();
  $("prompt").focus();
}

start();
