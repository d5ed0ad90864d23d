// A websocket that stays connected: reconnects with backoff, and a heartbeat that finds a
// dead connection the browser has not noticed. The conversation's socket (socket.js) and
// the person's own (user_socket.js) are both one; each says what its url is and what it
// does on open, on a message and when the server closes it for good.
//
// Backoff: 0.5 s, 1 s, 2 s … up to 15 s, with jitter so that many tabs do not return at
// once; at once when the browser is back online or the tab visible again. Heartbeat: a
// ping every 20 s; a connection silent for 50 s (a laptop that slept, a proxy that
// dropped it) is taken for dead and replaced.

export class ReconnectingSocket {
  constructor() {
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

  /** The websocket's URL (a subclass's). */
  get url() {
    throw new Error("a ReconnectingSocket needs a url");
  }

  // What a subclass does: before each try (`attempt` 0 the first time), once open, with
  // each message (parsed JSON), after scheduling a reconnect (seconds until it), and when
  // the server closed it with a code that means "do not come back" (its reason, or null
  // for a code that does not: then it reconnects).
  connecting() {}
  opened(_ws) {}
  received(_message) {}
  reconnecting(_seconds) {}
  closeReason(_code) {
    return null;
  }
  closed(_reason) {}

  connect() {
    if (this.stopped) return;
    clearTimeout(this.timer);
    this.connecting();
    const ws = new WebSocket(this.url);
    this.ws = ws;
    ws.addEventListener("open", () => {
      this.attempt = 0;
      this.lastSeen = Date.now();
      this.startHeartbeat();
      this.opened(ws);
    });
    ws.addEventListener("message", (event) => {
      this.lastSeen = Date.now();
      let message;
      try {
        message = JSON.parse(event.data);
      } catch {
        return;
      }
      this.received(message);
    });
    ws.addEventListener("close", (event) => {
      if (this.ws !== ws) return;
      this.stopHeartbeat();
      this.ws = null;
      const reason = this.closeReason(event.code);
      if (reason) {
        this.stopped = true;
        this.closed(reason);
        return;
      }
      this.scheduleReconnect();
    });
  }

  scheduleReconnect() {
    if (this.stopped) return;
    const delay = Math.min(15, 0.5 * 2 ** this.attempt) * (0.75 + Math.random() * 0.5);
    this.attempt += 1;
    this.reconnecting(Math.ceil(delay));
    this.timer = setTimeout(() => this.connect(), delay * 1000);
  }

  reconnectNow() {
    if (this.stopped || this.ws) return;
    clearTimeout(this.timer);
    this.connect();
  }

  /** A connection silent for too long: closed, and a reconnect scheduled. */
  dropSilent() {
    const ws = this.ws;
    this.ws = null;
    ws.close();
    this.stopHeartbeat();
    this.scheduleReconnect();
  }

  startHeartbeat() {
    this.stopHeartbeat();
    this.heartbeat = setInterval(() => {
      if (!this.ws) return;
      if (Date.now() - this.lastSeen > 50_000) {
        this.dropSilent();
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
