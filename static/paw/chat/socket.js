// The conversation's websocket: resume from the last cursor, reconnect with backoff.
//
// Exactly once, in order: the client remembers the cursor of the last event it handled
// (a run.event frame, or one of a run.events frame's events) and sends
// `resume {after: cursor}` on every (re)connect; the server replays what is stored after
// it and then streams live events. A cursor at or below the last one is ignored, so a
// replay can never double anything.

const CLOSE_REASONS = {
  4401: "You are signed out: sign in again.",
  4404: "This conversation does not exist (or no longer does).",
};

export class ConversationSocket {
  /**
   * @param {string} conversationId
   * @param {{onMessage: (message: object) => void, onState: (state: string, detail?: string) => void}} handlers
   *   onState gets "connecting", "connected", "reconnecting" (with the seconds until the
   *   next try) or "closed" (with the reason: no more tries).
   */
  constructor(conversationId, { onMessage, onState }) {
    this.conversationId = conversationId;
    this.onMessage = onMessage;
    this.onState = onState;
    this.cursor = 0;
    this.ws = null;
    this.attempt = 0;
    this.timer = null;
    this.stopped = false;
    this.lastSeen = 0;
    this.heartbeat = null;
    window.addEventListener("online", () => this.reconnectNow());
    document.addEventListener("visibilitychange", () => {
      if (document.visibilityState === "visible") this.reconnectNow();
    });
  }

  get url() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    // frames=batch: the server sends the events of a stored batch (or a replay page) as
    // one run.events frame, fewer frames when a stream is busy.
    return `${scheme}//${location.host}/ws/conversations/${this.conversationId}/?frames=batch`;
  }

  connect() {
    if (this.stopped) return;
    clearTimeout(this.timer);
    this.onState(this.attempt ? "reconnecting" : "connecting");
    const ws = new WebSocket(this.url);
    this.ws = ws;
    ws.addEventListener("open", () => {
      this.attempt = 0;
      this.lastSeen = Date.now();
      ws.send(JSON.stringify({ type: "resume", after: this.cursor }));
      this.onState("connected");
      this.startHeartbeat();
    });
    ws.addEventListener("message", (event) => {
      this.lastSeen = Date.now();
      let message;
      try {
        message = JSON.parse(event.data);
      } catch {
        return;
      }
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
    });
    ws.addEventListener("close", (event) => {
      if (this.ws !== ws) return;
      this.stopHeartbeat();
      this.ws = null;
      if (CLOSE_REASONS[event.code]) {
        this.stopped = true;
        this.onState("closed", CLOSE_REASONS[event.code]);
        return;
      }
      this.scheduleReconnect();
    });
  }

  handleEvent(message) {
    if (message.cursor <= this.cursor) return; // already handled
    this.cursor = message.cursor;
    this.onMessage(message);
  }

  scheduleReconnect() {
    if (this.stopped) return;
    // 0.5 s, 1 s, 2 s … up to 15 s, with jitter so that many tabs do not return at once.
    const delay = Math.min(15, 0.5 * 2 ** this.attempt) * (0.75 + Math.random() * 0.5);
    this.attempt += 1;
    this.onState("reconnecting", Math.ceil(delay));
    this.timer = setTimeout(() => this.connect(), delay * 1000);
  }

  reconnectNow() {
    if (this.stopped || this.ws) return;
    clearTimeout(this.timer);
    this.connect();
  }

  startHeartbeat() {
    this.stopHeartbeat();
    // A ping every 20 s; a connection silent for 50 s is dead even if the browser has not
    // noticed (a laptop that slept, a proxy that dropped it): close it and reconnect.
    this.heartbeat = setInterval(() => {
      if (!this.ws) return;
      if (Date.now() - this.lastSeen > 50_000) {
        const ws = this.ws;
        this.ws = null;
        ws.close();
        this.stopHeartbeat();
        this.scheduleReconnect();
        return;
      }
      this.send({ type: "ping" });
    }, 20_000);
  }

  stopHeartbeat() {
    clearInterval(this.heartbeat);
    this.heartbeat = null;
  }

  /** Send a message; false when the socket is not open (the caller may use the API). */
  send(message) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(JSON.stringify(message));
    return true;
  }

  get open() {
    return Boolean(this.ws && this.ws.readyState === WebSocket.OPEN);
  }
}
