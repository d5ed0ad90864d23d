// The person's own websocket (/ws/user/): the conversation list's live feed.
//
// The server sends `conversation.updated {conversation}` (a conversation's whole sidebar
// state) and `conversation.removed {id}`; nothing is replayed, so on every (re)connect
// `onOpen` runs and the sidebar re-reads the REST list: nothing missed while away stays
// missed. Reconnects with backoff; a ping every 20 s, and a socket silent for 50 s is
// taken for dead and replaced.

export class UserSocket {
  /**
   * @param {{onMessage: (message: object) => void, onOpen: () => void, onClosed?: () => void}} handlers
   *   onClosed: the server closed it for good (4401: signed out).
   */
  constructor({ onMessage, onOpen, onClosed }) {
    this.onMessage = onMessage;
    this.onOpen = onOpen;
    this.onClosed = onClosed || (() => {});
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
    return `${scheme}//${location.host}/ws/user/`;
  }

  connect() {
    if (this.stopped) return;
    clearTimeout(this.timer);
    const ws = new WebSocket(this.url);
    this.ws = ws;
    ws.addEventListener("open", () => {
      this.attempt = 0;
      this.lastSeen = Date.now();
      this.startHeartbeat();
      this.onOpen();
    });
    ws.addEventListener("message", (event) => {
      this.lastSeen = Date.now();
      let message;
      try {
        message = JSON.parse(event.data);
      } catch {
        return;
      }
      if (message.type === "pong" || message.type === "error") return;
      this.onMessage(message);
    });
    ws.addEventListener("close", (event) => {
      if (this.ws !== ws) return;
      this.stopHeartbeat();
      this.ws = null;
      if (event.code === 4401) {
        this.stopped = true;
        this.onClosed();
        return;
      }
      this.scheduleReconnect();
    });
  }

  scheduleReconnect() {
    if (this.stopped) return;
    const delay = Math.min(15, 0.5 * 2 ** this.attempt) * (0.75 + Math.random() * 0.5);
    this.attempt += 1;
    this.timer = setTimeout(() => this.connect(), delay * 1000);
  }

  reconnectNow() {
    if (this.stopped || this.ws) return;
    clearTimeout(this.timer);
    this.connect();
  }

  /** Drop the connection (as a lost one is) and connect again at once. */
  restart() {
    const ws = this.ws;
    this.ws = null;
    this.stopHeartbeat();
    if (ws) ws.close();
    this.attempt = 0;
    this.connect();
  }

  startHeartbeat() {
    this.stopHeartbeat();
    this.heartbeat = setInterval(() => {
      if (!this.ws) return;
      if (Date.now() - this.lastSeen > 50_000) {
        this.restart();
        return;
      }
      if (this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify({ type: "ping" }));
    }, 20_000);
  }

  stopHeartbeat() {
    clearInterval(this.heartbeat);
    this.heartbeat = null;
  }
}
