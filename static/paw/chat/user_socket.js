// The person's own websocket (/ws/user/): the conversation list's live feed.
//
// The server sends `conversation.updated {conversation}` (a conversation's whole sidebar
// state) and `conversation.removed {id}`; nothing is replayed, so on every (re)connect
// `onOpen` runs and the sidebar re-reads the REST list: nothing missed while away stays
// missed. Reconnects with backoff, a ping every 20 s (reconnecting_socket.js); a socket
// silent for 50 s is taken for dead and replaced at once.

import { ReconnectingSocket } from "./reconnecting_socket.js";

export class UserSocket extends ReconnectingSocket {
  /**
   * @param {{onMessage: (message: object) => void, onOpen: () => void, onClosed?: () => void}} handlers
   *   onClosed: the server closed it for good (4401: signed out).
   */
  constructor({ onMessage, onOpen, onClosed }) {
    super();
    this.onMessage = onMessage;
    this.onOpen = onOpen;
    this.onClosed = onClosed || (() => {});
  }

  get url() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    return `${scheme}//${location.host}/ws/user/`;
  }

  opened() {
    this.onOpen();
  }

  received(message) {
    if (message.type === "pong" || message.type === "error") return;
    this.onMessage(message);
  }

  closeReason(code) {
    return code === 4401 ? "signed out" : null;
  }

  closed() {
    this.onClosed();
  }

  /** A silent connection: replaced at once (the list is re-read on open). */
  dropSilent() {
    this.restart();
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
}
