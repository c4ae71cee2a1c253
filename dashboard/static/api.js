// The JSON API with the user's Bearer key (kept in sessionStorage). A 401 signs the page out through the
// handler the router registers, so this module needs no view of its own.
import { setConnection } from "./dom.js";

const KEY_STORAGE = "torchyard.apiKey";
let apiKey = sessionStorage.getItem(KEY_STORAGE);
let onUnauthorized = () => {};

export const hasKey = () => Boolean(apiKey);
export const whenUnauthorized = (handler) => (onUnauthorized = handler);

// Tries the key before keeping it; `remember` false leaves nothing behind.
export function setKey(key, remember) {
  apiKey = key;
  if (key && remember) sessionStorage.setItem(KEY_STORAGE, key);
  if (!key) sessionStorage.removeItem(KEY_STORAGE);
}

export class ApiError extends Error {
  constructor(status, detail) {
    super(`${status}: ${detail}`);
    this.status = status;
    this.detail = detail;
  }
}

export async function api(path, { method = "GET", headers = {}, body, signal, raw = false } = {}) {
  const init = { method, signal, headers: { Authorization: `Bearer ${apiKey}`, Accept: "application/json", ...headers } };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (err) {
    if (err.name === "AbortError") throw err;
    setConnection(false);
    throw new ApiError(0, "the API does not answer");
  }
  setConnection(true);
  if (res.status === 401) {
    onUnauthorized("The API refused this key.");
    throw new ApiError(401, "unauthorized");
  }
  if (!res.ok) {
    let detail = res.statusText;
    try {
      detail = (await res.json()).detail || detail;
    } catch {
      // not problem+json (a proxy page); keep the status text
    }
    throw new ApiError(res.status, detail);
  }
  return raw ? res : res.json();
}

// A 404 whose detail is the framework's bare "Not Found", or this API's "no such path in this API", means the route
// itself is missing (an API version without that endpoint); a missing job says "job ... not found".
export const routeMissing = (err) =>
  err instanceof ApiError && err.status === 404 && /^(not found|no such path in this api\b.*)$/i.test(err.detail || "");

// Errors a view's loop ends on quietly: its view was left (abort) or the key was refused (the login shows).
export const quiet = (err) => err.name === "AbortError" || err.status === 401;
