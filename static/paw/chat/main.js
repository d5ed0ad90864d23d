// The chat page: wires the sidebar, the transcript, files, approvals, the model picker
// and the usage badge to the REST API and the conversation's websocket.

import { api, apiAll } from "./api.js";
import { ApprovalPanels } from "./approvals.js";
import { confirmAction, nearBottom } from "./dom.js";
import { FilesPanel } from "./files.js";
import { ModelPicker } from "./models.js";
import { Sidebar } from "./sidebar.js";
import { ConversationSocket } from "./socket.js";
import { Transcript } from "./transcript.js";
import { UsageBadge } from "./usage.js";

const config = JSON.parse(document.getElementById("paw-config").textContent);
const $ = (id) => document.getElementById(id);

const state = {
  conversationId: config.conversationId,
  conversation: null,
  creating: null,
  socket: null,
  pendingChoice: { llm_provider: "", llm_model: "" },
  stickToBottom: true,
};

const transcriptEl = $("transcript");
const prompt = $("prompt");
const sendButton = $("send");
const cancelButton = $("cancel-run");
const runStatus = $("run-status");
const composerError = $("composer-error");
const connection = $("connection");

const base = () => `/api/conversations/${state.conversationId}`;

// --- the parts ----------------------------------------------------------------------

const transcript = new Transcript(transcriptEl, {
  fetchRun: (runId) => api("GET", `${base()}/runs/${runId}`),
  demoProvider: config.demoProvider,
  onChange: () => {
    if (state.stickToBottom) transcriptEl.scrollTop = transcriptEl.scrollHeight;
    updateRunControls();
  },
});
transcriptEl.addEventListener("scroll", () => {
  state.stickToBottom = nearBottom(transcriptEl);
});

const approvals = new ApprovalPanels($("approvals"), {
  decide: async (approvalId, decision) => {
    if (state.socket && state.socket.send({ type: "agent_confirm_response", approval_id: approvalId, ...decision })) return;
    await api("POST", `/api/approvals/${approvalId}/decision`, decision); // no socket: the API
  },
});

const files = new FilesPanel({
  chips: $("file-chips"),
  progress: $("upload-progress"),
  artifacts: $("artifact-list"),
  artifactEmpty: $("artifact-empty"),
  maxBytes: config.maxUploadBytes,
  conversationId: () => ensureConversation(),
  currentId: () => state.conversationId,
  onError: (message) => showError(message),
});

const sidebar = new Sidebar($("conversation-list"), $("conversation-list-empty"), () => state.conversationId);

const picker = new ModelPicker($("model-picker"), $("model-note"), {
  onChange: async (choice) => {
    if (!state.conversationId) {
      state.pendingChoice = choice;
      return;
    }
    state.conversation = await api("PATCH", base(), choice);
  },
});
picker.onProvider((name) => {
  $("demo-banner").hidden = !(config.demoProvider && name === config.demoProvider);
  // With a real provider available, the way out of the demo is the model picker.
  if (picker.providers.some((p) => p.active && p.name !== config.demoProvider)) {
    $("demo-next").textContent = "Pick another model above to talk to a real one.";
  }
});

const usage = new UsageBadge($("usage-badge"));

// --- conversation ---------------------------------------------------------------------

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
  sidebar.refresh();
  connect();
}

function showTitle(title) {
  const shown = title || "New conversation";
  $("conversation-title").textContent = shown;
  document.title = `${shown} · PAW`;
}

async function refreshConversation() {
  if (!state.conversationId) return;
  try {
    state.conversation = await api("GET", base());
  } catch {
    return;
  }
  showTitle(state.conversation.title);
  sidebar.note(state.conversationId, { title: state.conversation.title });
  return state.conversation;
}

// --- the socket -----------------------------------------------------------------------

function connect() {
  if (state.socket) return;
  transcriptEl.setAttribute("aria-busy", "true"); // the replay is not read out
  state.socket = new ConversationSocket(state.conversationId, { onMessage, onState });
  state.socket.connect();
}

let replayQuiet = null;
let artifactsSoon = null;

function refreshArtifactsSoon() {
  clearTimeout(artifactsSoon);
  artifactsSoon = setTimeout(() => files.refreshArtifacts().catch(() => {}), 300);
}

function onMessage(message) {
  switch (message.type) {
    case "run.event": {
      clearTimeout(replayQuiet);
      replayQuiet = setTimeout(() => transcriptEl.setAttribute("aria-busy", "false"), 400);
      transcript.handleEvent(message);
      const event = message.event || {};
      const view = transcript.runs.get(message.run_id);
      if (event.type === "notify" && event.kind === "usage" && view?.active) usage.setRun(event.data);
      if ((event.type === "notify" && event.kind === "tool") || event.type === "result") refreshArtifactsSoon();
      break;
    }
    case "run.status": {
      transcript.handleStatus(message);
      const view = transcript.runs.get(message.run_id);
      sidebar.note(state.conversationId, { active: Boolean(transcript.activeRun()) });
      if (view && !view.active) {
        showError(""); // e.g. "still working" no longer holds
        refreshArtifactsSoon();
        files.refreshFiles().catch(() => {});
        usage.refresh();
        if (view.usage) usage.setRun(view.usage);
      }
      break;
    }
    case "agent_confirm_request":
      approvals.show(message);
      transcript.noteApproval({ ...message, status: "pending" });
      break;
    case "agent_confirm_resolved":
      approvals.resolve(message);
      transcript.noteApproval(message);
      break;
    case "error":
      if (message.code === "approval_closed") reconcileApprovals();
      else showError(message.detail);
      break;
    default:
      break;
  }
}

function onState(socketState, detail) {
  connection.dataset.state = socketState;
  connection.textContent = {
    connecting: "Connecting…",
    connected: "Connected",
    reconnecting: "Reconnecting…",
    closed: detail || "Disconnected",
  }[socketState];
  connection.title = socketState === "reconnecting" && detail ? `Next try in ${detail} s` : "";
  if (socketState === "closed" && /signed out/.test(detail || "")) {
    location.assign(`/accounts/login/?next=${encodeURIComponent(location.pathname)}`);
  }
  if (socketState === "connected") setTimeout(reconcile, 1500);
}

/** After a reconnect: what may have ended while the socket was down. */
async function reconcile() {
  await reconcileApprovals();
  const conversation = await refreshConversation();
  if (!conversation) return;
  for (const view of transcript.runs.values()) {
    if (view.active && view.runId !== conversation.active_run_id) {
      try {
        transcript.handleStatus({ ...(await api("GET", `${base()}/runs/${view.runId}`)), run_id: view.runId });
      } catch {
        // the next reconnect tries again
      }
    }
  }
  updateRunControls();
}

async function reconcileApprovals() {
  if (!state.conversationId) return;
  try {
    const pending = await apiAll(`${base()}/approvals?status=pending&page_size=100`);
    approvals.keepOnly(new Set(pending.map((approval) => approval.id)));
    const all = await apiAll(`${base()}/approvals?page_size=100`);
    transcript.seedApprovals(all);
  } catch {
    // shown again on the next connect
  }
}

// --- the composer ---------------------------------------------------------------------

function showError(text) {
  composerError.textContent = text || "";
  composerError.hidden = !text;
}

function updateRunControls() {
  const active = transcript.activeRun();
  cancelButton.hidden = !active;
  sendButton.disabled = Boolean(active) || Boolean(state.sending);
  sendButton.title = active ? "The agent is still working: wait for it, or cancel it." : "";
  // A status region: screen readers hear "Working…", then how the run ended.
  const last = active || [...transcript.runs.values()].pop();
  runStatus.textContent = last ? last.statusEl.textContent : "";
}

async function send(event) {
  event.preventDefault();
  const text = prompt.value.trim();
  if (!text) {
    prompt.focus();
    return;
  }
  if (transcript.activeRun()) {
    showError("The agent is still working on your last message: wait for it, or cancel it.");
    return;
  }
  showError("");
  state.sending = true;
  updateRunControls();
  try {
    const id = await ensureConversation();
    const untitled = !state.conversation?.title;
    const run = await api("POST", `/api/conversations/${id}/runs`, { prompt: text });
    prompt.value = "";
    state.stickToBottom = true;
    const view = transcript.run(run.id);
    view.setPrompt(run.prompt);
    view.setStatus(run);
    usage.setRun({ input: 0, output: 0 });
    sidebar.note(id, { active: true });
    transcript.onChange();
    if (untitled) refreshConversation();
  } catch (error) {
    showError(error.message);
  } finally {
    state.sending = false;
    updateRunControls();
  }
}

$("composer").addEventListener("submit", send);
prompt.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});

cancelButton.addEventListener("click", async () => {
  const active = transcript.activeRun();
  if (!active) return;
  cancelButton.disabled = true;
  runStatus.textContent = "Cancelling…";
  try {
    await api("POST", `${base()}/runs/${active.runId}/cancel`);
  } catch (error) {
    if (error.code !== "run_finished") showError(error.message);
  } finally {
    cancelButton.disabled = false;
  }
});

// --- files ----------------------------------------------------------------------------

$("upload-button").addEventListener("click", () => $("file-input").click());
$("file-input").addEventListener("change", (event) => {
  files.add(event.target.files);
  event.target.value = "";
});
files.acceptDrops($("main"), $("drop-overlay"));

// --- conversation settings ------------------------------------------------------------

$("auto-approve").addEventListener("change", async (event) => {
  const wanted = event.target.checked;
  try {
    if (!state.conversationId) {
      await ensureConversation(); // created with the box's value
      return;
    }
    state.conversation = await api("PATCH", base(), { auto_approve: wanted });
  } catch (error) {
    event.target.checked = !wanted;
    showError(error.message);
  }
});

// A new conversation starts as a blank page: the first message or upload creates it, so
// clicking twice leaves no empty conversations behind.
$("new-conversation").addEventListener("click", () => {
  if (state.conversationId) location.assign("/");
  else prompt.focus();
});

$("rename-conversation").addEventListener("click", () => {
  const dialog = $("rename-dialog");
  $("rename-input").value = state.conversation?.title || "";
  dialog.showModal();
});
$("rename-cancel").addEventListener("click", () => $("rename-dialog").close("cancel"));
$("rename-dialog").addEventListener("close", async () => {
  if ($("rename-dialog").returnValue !== "ok") return;
  try {
    state.conversation = await api("PATCH", base(), { title: $("rename-input").value.trim() });
    showTitle(state.conversation.title);
    sidebar.note(state.conversationId, { title: state.conversation.title });
  } catch (error) {
    showError(error.message);
  }
});

$("delete-conversation").addEventListener("click", async () => {
  const sure = await confirmAction({
    title: "Delete this conversation?",
    text: "Its messages, its files and everything the agent made are deleted for good.",
    ok: "Delete",
    cancel: "Keep it",
  });
  if (!sure) return;
  try {
    await api("DELETE", base());
    location.assign("/");
  } catch (error) {
    showError(error.message);
  }
});

// --- narrow screens -------------------------------------------------------------------

const narrow = window.matchMedia("(max-width: 48rem)");
const sidebarToggle = $("sidebar-toggle");
sidebarToggle.addEventListener("click", () => {
  const open = !document.body.classList.contains("sidebar-open");
  document.body.classList.toggle("sidebar-open", open);
  sidebarToggle.setAttribute("aria-expanded", String(open));
  if (open) document.querySelector("#conversation-list a, #new-conversation")?.focus();
});
function closeSidebar() {
  if (!document.body.classList.contains("sidebar-open")) return;
  document.body.classList.remove("sidebar-open");
  sidebarToggle.setAttribute("aria-expanded", "false");
  sidebarToggle.focus();
}
$("main").addEventListener("click", (event) => {
  if (!sidebarToggle.contains(event.target)) closeSidebar();
});
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape") closeSidebar();
});
// On a phone the conversation gets the height: the files start folded.
if (narrow.matches) $("files").open = false;

// --- start ----------------------------------------------------------------------------

async function start() {
  sidebar.refresh();
  usage.refresh();
  picker.load().catch((error) => {
    $("model-note").textContent = error.message;
  });
  if (!state.conversationId) {
    prompt.focus();
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
    $("auto-approve").checked = conversation.auto_approve;
    transcript.seedRuns(runs);
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
  prompt.focus();
}

start();
