// The REST API as the chat page uses it: session cookie + CSRF token, JSON errors.

/** An API error: `status` (HTTP), `code` (machine code), `message` (a human sentence). */
export class ApiError extends Error {
  constructor(status, code, detail, body = {}) {
    super(detail);
    this.status = status;
    this.code = code;
    this.body = body;
  }
}

function csrfToken() {
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

const SIGNED_OUT = new Set(["not_authenticated", "authentication_failed"]);

function errorFrom(status, body) {
  if ((status === 401 || status === 403) && SIGNED_OUT.has(body?.code)) {
    // Signed out (in another tab, or the session ended): to the sign-in page, and back.
    location.assign(`/accounts/login/?next=${encodeURIComponent(location.pathname)}`);
    return new ApiError(status, body.code, "Your session has ended: sign in again.", body);
  }
  if (body && typeof body === "object" && body.detail) {
    return new ApiError(status, body.code || "error", String(body.detail), body);
  }
  if (status === 401 || status === 403) {
    return new ApiError(status, "not_authenticated", "Your session has ended: sign in again.");
  }
  if (status >= 500) {
    return new ApiError(status, "server_error", "PAW had a problem on its side; try again in a moment.");
  }
  return new ApiError(status, "error", `The request failed (HTTP ${status}).`);
}

/**
 * Call the API: api("POST", "/api/conversations", {title: "x"}) → the JSON body
 * (null for 204). Throws ApiError with the server's detail, or a plain network message.
 */
export async function api(method, path, body = undefined) {
  const headers = { Accept: "application/json" };
  if (method !== "GET") headers["X-CSRFToken"] = csrfToken();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "same-origin",
    });
  } catch {
    throw new ApiError(0, "network", "Could not reach PAW: check your connection.");
  }
  if (response.status === 204) return null;
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  if (!response.ok) throw errorFrom(response.status, data);
  return data;
}

/** Every item of a paginated list (follows `next` links; page-number or cursor pages). */
export async function apiAll(path) {
  const items = [];
  let next = path;
  while (next) {
    const page = await api("GET", next);
    if (Array.isArray(page)) return items.concat(page);
    items.push(...page.results);
    // Follow the server's link on this origin (behind a proxy its host may differ).
    const url = page.next ? new URL(page.next, location.href) : null;
    next = url ? url.pathname + url.search : null;
  }
  return items;
}

/**
 * Upload one file (multipart field "file") with progress:
 * upload(path, file, (loaded, total) => ...) → {promise, abort}. The promise gives the
 * created file's JSON or rejects with ApiError.
 */
export function upload(path, file, onProgress) {
  const request = new XMLHttpRequest();
  const promise = new Promise((resolve, reject) => {
    request.open("POST", path);
    request.setRequestHeader("X-CSRFToken", csrfToken());
    request.setRequestHeader("Accept", "application/json");
    request.responseType = "json";
    request.upload.addEventListener("progress", (event) => {
      if (event.lengthComputable) onProgress(event.loaded, event.total);
    });
    request.addEventListener("load", () => {
      if (request.status >= 200 && request.status < 300) resolve(request.response);
      else reject(errorFrom(request.status, request.response));
    });
    request.addEventListener("error", () =>
      reject(new ApiError(0, "network", "The upload was interrupted: check your connection.")),
    );
    request.addEventListener("abort", () => reject(new ApiError(0, "aborted", "Upload cancelled.")));
    const form = new FormData();
    form.append("file", file, file.name);
    request.send(form);
  });
  return { promise, abort: () => request.abort() };
}
