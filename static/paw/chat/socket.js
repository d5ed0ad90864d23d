// The conversation's websocket: resume from the last cursor, reconnect with backoff
// (reconnecting_socket.js).
//
// Exactly once, in order: the client remembers the cursor of the last event it handled
// (a run.event frame, or one of a run.events frame's events) and sends
// `resume {after: cursor}` on every (re)connect; the server replays what is stored after
// it and then streams live events. A cursor at or below the last one is ignored, so a
// replay can never double anything.

import { ReconnectingSocket } from "./reconnecting_socket.js";

const CLOSE_REASONS = {
  4401: "You are signed out: sign in again.",
  4404: "This conversation does not exist (or no longer does).",
};

export class ConversationSocket extends ReconnectingSocket {
  /**
   * @param {string} conversationId
   * @param {{onMessage: (message: object) => void, onState: (state: string, detail?: string) => void}} handlers
   *   onState gets "connecting", "connected", "reconnecting" (with the seconds until the
   *   next try) or "closed" (with the reason: no more tries).
   */
  constructor(conversationId, { onMessage, onState }) {
    super();
    this.conversationId = conversationId;
    this.onMessage = onMessage;
    this.onState = onState;
    this.cursor = 0;
  }

  get url() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    // frames=batch: the server sends the events of a stored batch (or a replay page) as
    // one run.events frame, fewer frames when a stream is busy.
    return `${scheme}//${location.host}/ws/conversations/${this.conversationId}/?frames=batch`;
  }

  connecting() {
    this.onState(this.attempt ? "reconnecting" : "connecting");
  }

  opened(ws) {
    ws.send(JSON.stringify({ type: "resume", after: this.cursor }));
    this.onState("connected");
  }

  received(message) {
    if (message.type === "run.events") {
      for (const item of message.events || []) this.handleEvent({ type: "run.event", ...item });
      return;
    }
    if (message.type === "run.event") {
      this.handleEvent(message);
      return;
    }
    if (message.type === "pong") return;
    this.onMessage(message);
  }

  reconnecting(seconds) {
    this.onState("reconnecting", seconds);
  }

  closeReason(code) {
    return CLOSE_REASONS[code] || null;
  }

  closed(reason) {
    this.onState("closed", reason);
  }

  handleEvent(message) {
    if (message.cursor <= this.cursor) return; // already handled
    this.cursor = message.cursor;
    this.onMessage(message);
  }
}
