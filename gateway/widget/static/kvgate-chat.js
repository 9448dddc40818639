/*! kvgate chat widget v1 | embed:
 *  <script src="https://GATEWAY/widget/v1/kvgate-chat.js" data-key="WIDGET_KEY" defer></script>
 *  Options (data-*): key, title, greeting, accent, position (left|right), open (true),
 *  session-url, model, max-tokens, temperature. Plain JS, no build step; see docs/widget.md.
 *
 *  History: in the tab (sessionStorage), or on the server when the tenant turns it on and the
 *  page gives a session-url (the conversation then follows the visitor's session token).
 *
 *  Safety: nothing the model (or the server) sends is parsed as HTML. Text is inserted as text
 *  nodes; the only elements built from it are links, and only for http(s) URLs.
 */
(() => {
  "use strict";
  const script =
    document.currentScript || document.querySelector('script[src*="/widget/v1/kvgate-chat.js"]');
  if (!script || !script.src) return;
  const opts = script.dataset;
  const BASE = script.src.replace(/\/widget\/v1\/kvgate-chat\.js(?:[?#].*)?$/, "");
  const STORE_KEY = "kvgate-chat:" + BASE + ":" + (opts.key || "");
  const URL_RE = /\bhttps?:\/\/[^\s<>"'`]+[^\s<>"'`.,;:!?)\]]/g;

  const CSS = `
:host { all: initial; }
* { box-sizing: border-box; }
.root { --accent: #2457d6; --bg: #ffffff; --fg: #1b1f29; --muted: #5b6475; --line: #d8dde8;
  --user: #e9effd; --bot: #f3f5f9; --err: #b3261e;
  font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
  position: fixed; bottom: 16px; right: 16px; z-index: 2147483000; }
.root.left { right: auto; left: 16px; }
@media (prefers-color-scheme: dark) {
  .root { --bg: #181b23; --fg: #e8ebf2; --muted: #a3acbd; --line: #343a4a; --user: #24304d;
    --bot: #222733; --err: #ff8a80; }
}
button { font: inherit; cursor: pointer; }
:focus-visible { outline: 3px solid var(--accent); outline-offset: 2px; }
.launcher { width: 56px; height: 56px; border-radius: 50%; border: 0; background: var(--accent);
  color: #fff; display: grid; place-items: center; box-shadow: 0 4px 16px rgba(0,0,0,.25); }
.launcher svg { width: 26px; height: 26px; fill: currentColor; }
.panel { position: absolute; bottom: 68px; right: 0; width: min(380px, calc(100vw - 32px));
  height: min(560px, calc(100vh - 100px)); display: flex; flex-direction: column;
  background: var(--bg); border: 1px solid var(--line); border-radius: 14px; overflow: hidden;
  box-shadow: 0 12px 40px rgba(0,0,0,.28); }
.left .panel { right: auto; left: 0; }
.panel[hidden] { display: none; }
header { display: flex; align-items: center; gap: 6px; padding: 10px 10px 10px 14px;
  background: var(--accent); color: #fff; }
h2 { flex: 1; margin: 0; font-size: 16px; font-weight: 600; overflow: hidden;
  text-overflow: ellipsis; white-space: nowrap; }
header button { background: transparent; color: #fff; border: 1px solid rgba(255,255,255,.5);
  border-radius: 8px; padding: 3px 8px; font-size: 13px; }
header .close { font-size: 18px; line-height: 1; padding: 2px 8px; }
.log { flex: 1; overflow-y: auto; padding: 12px; display: flex; flex-direction: column; gap: 8px; }
.msg { max-width: 88%; padding: 8px 11px; border-radius: 12px; white-space: pre-wrap;
  overflow-wrap: anywhere; }
.msg.user { align-self: flex-end; background: var(--user); }
.msg.assistant, .msg.greeting { align-self: flex-start; background: var(--bot); }
.msg.stopped::after { content: " (stopped)"; color: var(--muted); font-style: italic; }
.msg a { color: var(--accent); }
@media (prefers-color-scheme: dark) { .msg a { color: #9db8ff; } }
.sr { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0);
  white-space: nowrap; }
.status { padding: 0 12px; color: var(--err); font-size: 13px; }
.status:empty { display: none; }
.status.tool { color: var(--muted); font-style: italic; }
.status button { margin-left: 6px; border: 1px solid var(--line); border-radius: 8px;
  background: var(--bg); color: var(--fg); padding: 2px 8px; }
form { display: flex; gap: 8px; padding: 10px; border-top: 1px solid var(--line); }
textarea { flex: 1; min-width: 0; resize: none; font: inherit; color: var(--fg);
  background: var(--bg); border: 1px solid var(--line); border-radius: 10px; padding: 7px 9px; }
form button { border: 0; border-radius: 10px; padding: 0 14px; background: var(--accent);
  color: #fff; font-weight: 600; }
form button:disabled { opacity: .5; cursor: default; }
form button[hidden] { display: none; }
`;
  const HISTORY = 40; // messages sent with each request (the newest ones)

  /** The launcher's speech-bubble icon, built as nodes (no innerHTML anywhere: Trusted Types). */
  function icon() {
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("viewBox", "0 0 24 24");
    svg.setAttribute("aria-hidden", "true");
    const path = document.createElementNS(ns, "path");
    path.setAttribute("d", "M4 4h16a2 2 0 0 1 2 2v10a2 2 0 0 1-2 2H9l-5 4v-4H4a2 2 0 0 1-2-2V6a2 2 0 0 1 2-2z");
    svg.append(path);
    return svg;
  }

  // ---- DOM helpers: every piece of text goes in as a text node ---------------------------
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === false || value == null) continue;
      node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children) node.append(child);
    return node;
  }

  /** Text as nodes: plain text nodes, and <a> for http(s) URLs (the only markup built). */
  function richText(text) {
    const frag = document.createDocumentFragment();
    let last = 0;
    for (const match of text.matchAll(URL_RE)) {
      frag.append(document.createTextNode(text.slice(last, match.index)));
      let href = null;
      try {
        const url = new URL(match[0]);
        if (url.protocol === "http:" || url.protocol === "https:") href = url.href;
      } catch (_) {
        href = null;
      }
      frag.append(
        href
          ? el("a", { href, target: "_blank", rel: "noopener noreferrer" }, match[0])
          : document.createTextNode(match[0]),
      );
      last = match.index + match[0].length;
    }
    frag.append(document.createTextNode(text.slice(last)));
    return frag;
  }

  // ---- state kept in the tab (sessionStorage): the conversation and whether it is open ----
  // (with server history only whether it is open: the conversation is the server's)
  function loadState() {
    try {
      const data = JSON.parse(sessionStorage.getItem(STORE_KEY) || "null");
      if (data && Array.isArray(data.messages)) {
        const messages = data.messages.filter(
          (m) => m && (m.role === "user" || m.role === "assistant") && typeof m.content === "string",
        );
        return { messages, open: !!data.open };
      }
    } catch (_) {
      /* storage disabled or corrupt: start empty */
    }
    return { messages: [], open: null };
  }

  class Widget {
    constructor() {
      const saved = loadState();
      this.messages = saved.messages;
      this.config = {};
      this.controller = null;
      this.session = null; // {token, refreshAt}
      this.countdown = null;
      this.usable = false;
      this.conversation = null; // server history: the id of the conversation shown
      this.build(saved.open == null ? opts.open === "true" : saved.open);
    }

    build(open) {
      const host = el("kvgate-chat", { "data-state": "loading" });
      host.style.cssText = "all: initial !important; display: block !important;";
      this.host = host;
      const root = host.attachShadow({ mode: "open" });
      if (root.adoptedStyleSheets !== undefined && typeof CSSStyleSheet === "function") {
        const sheet = new CSSStyleSheet(); // CSSOM: no CSP 'unsafe-inline' needed for styles
        sheet.replaceSync(CSS);
        root.adoptedStyleSheets = [sheet];
      } else {
        root.append(el("style", {}, CSS));
      }
      this.launcher = el("button", {
        type: "button", class: "launcher", "aria-expanded": "false", "aria-controls": "kvg-panel",
        "aria-label": "Open chat",
      }, icon());
      this.title = el("h2", { id: "kvg-title" });
      this.newButton = el("button", { type: "button", class: "new" }, "New conversation");
      this.deleteButton = el("button", { type: "button", class: "delete", hidden: true }, "Delete");
      this.closeButton = el("button", { type: "button", class: "close", "aria-label": "Close chat" }, "×");
      this.log = el("div", { class: "log", role: "log", "aria-live": "polite", "aria-label": "Conversation" });
      this.status = el("div", { class: "status", role: "status" });
      this.input = el("textarea", { id: "kvg-input", rows: "2", placeholder: "Type a message…", maxlength: "4000" });
      this.send = el("button", { type: "submit", class: "send" }, "Send");
      this.stop = el("button", { type: "button", class: "stop", hidden: true }, "Stop");
      this.form = el("form", {}, el("label", { class: "sr", for: "kvg-input" }, "Message"), this.input, this.send, this.stop);
      this.panel = el("section", { class: "panel", id: "kvg-panel", role: "dialog", "aria-labelledby": "kvg-title", hidden: true },
        el("header", {}, this.title, this.newButton, this.deleteButton, this.closeButton), this.log, this.status, this.form);
      this.rootEl = el("div", { class: opts.position === "left" ? "root left" : "root" }, this.panel, this.launcher);
      root.append(this.rootEl);
      this.wire();
      this.applyConfig();
      this.renderAll();
      this.setBusy(false);
      document.body.append(host);
      if (open) this.setOpen(true, false);
    }

    wire() {
      this.launcher.addEventListener("click", () => this.setOpen(this.panel.hidden, true));
      this.closeButton.addEventListener("click", () => this.close());
      this.newButton.addEventListener("click", () => this.reset());
      this.deleteButton.addEventListener("click", () => this.forget());
      this.stop.addEventListener("click", () => this.controller && this.controller.abort());
      this.form.addEventListener("submit", (e) => {
        e.preventDefault();
        this.submit();
      });
      this.input.addEventListener("keydown", (e) => {
        if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
          e.preventDefault();
          this.submit();
        }
      });
      this.rootEl.addEventListener("keydown", (e) => {
        if (e.key === "Escape" && !this.panel.hidden) {
          e.preventDefault();
          this.close();
        }
      });
    }

    setOpen(open, focus) {
      this.panel.hidden = !open;
      this.launcher.setAttribute("aria-expanded", String(open));
      this.launcher.setAttribute("aria-label", open ? "Close chat" : "Open chat");
      this.save();
      if (open && focus) this.input.focus();
      if (open) this.log.scrollTop = this.log.scrollHeight;
    }

    close() {
      this.setOpen(false, false);
      this.launcher.focus();
    }

    /** History on the server: the tenant turned it on and the page gives a session URL. */
    get onServer() {
      return !!(this.config.history && opts.sessionUrl);
    }

    save() {
      try {
        const messages = this.onServer ? [] : this.messages;
        sessionStorage.setItem(STORE_KEY, JSON.stringify({ v: 1, messages, open: !this.panel.hidden }));
      } catch (_) {
        /* storage full or disabled: the conversation lives only in this page */
      }
    }

    setState(state) {
      this.host.setAttribute("data-state", state);
    }

    // ---- configuration: data-* attributes win over the tenant's server-side settings -----
    applyConfig() {
      const c = this.config;
      this.title.textContent = opts.title || c.title || "Chat";
      this.greeting = opts.greeting || c.greeting || "";
      const accent = opts.accent || c.accent;
      if (accent && window.CSS && CSS.supports("color", accent)) this.rootEl.style.setProperty("--accent", accent);
      this.model = opts.model || c.model || "";
    }

    async loadConfig() {
      if (!opts.key) return this.fail("This chat is not set up: the data-key attribute is missing.", null);
      this.setState("loading");
      let res;
      try {
        res = await fetch(BASE + "/widget/v1/config?key=" + encodeURIComponent(opts.key), { credentials: "omit" });
      } catch (_) {
        return this.fail("Cannot reach the chat service.", () => this.loadConfig());
      }
      const data = await res.json().catch(() => ({}));
      if (!res.ok) {
        const code = data.error && data.error.code;
        const why = code === "origin_not_allowed"
          ? "This chat is not allowed on this site (origin not allowed)."
          : "This chat is not available" + (data.error ? ": " + data.error.message : ".");
        return this.fail(why, res.status >= 500 ? () => this.loadConfig() : null);
      }
      this.config = data;
      this.applyConfig();
      this.renderAll();
      if (data.require_session && !opts.sessionUrl) {
        return this.fail("This chat needs a signed-in session, but the page gives no data-session-url.", null);
      }
      if (this.onServer && !(await this.loadHistory())) return;
      this.usable = true;
      this.clearStatus();
      this.setBusy(false);
      this.setState("ready");
    }

    // ---- history on the server: /v1/widget/conversation(s), the session token's visitor -----
    async history(method, path) {
      const call = (bearer) => fetch(BASE + path, {
        method, credentials: "omit", headers: { Authorization: "Bearer " + bearer, Accept: "application/json" },
      });
      let res = await call(await this.bearer(false));
      if (res.status === 401) res = await call(await this.bearer(true));
      const data = await res.json().catch(() => ({}));
      if (!res.ok) throw new HistoryError((data.error && data.error.message) || "HTTP " + res.status);
      return data;
    }

    async loadHistory() {
      this.deleteButton.hidden = false;
      try {
        const data = await this.history("GET", "/v1/widget/conversation");
        this.showConversation(data);
        return true;
      } catch (err) {
        const why = err instanceof HistoryError || err instanceof SessionError ? err.message : "Cannot reach the chat service.";
        this.fail("The conversation could not be loaded: " + why, () => this.loadConfig());
        return false;
      }
    }

    showConversation(data) {
      this.conversation = data.id || null;
      this.messages = (Array.isArray(data.messages) ? data.messages : []).filter(
        (m) => m && (m.role === "user" || m.role === "assistant") && typeof m.content === "string",
      );
      this.renderAll();
    }

    /** The conversation the next message goes to: the one shown, or a new one. */
    async conversationId() {
      if (!this.conversation) this.conversation = (await this.history("POST", "/v1/widget/conversations")).id;
      return this.conversation;
    }

    async forget() {
      if (this.controller) this.controller.abort();
      const id = this.conversation;
      this.clearStatus();
      try {
        if (id) await this.history("DELETE", "/v1/widget/conversations/" + encodeURIComponent(id));
        this.showConversation({ id: null, messages: [] });
        this.setState("deleted");
      } catch (err) {
        this.fail("The conversation could not be deleted: " + err.message, () => this.forget());
      }
    }

    // ---- rendering ---------------------------------------------------------------------------
    bubble(role, text) {
      const node = el("div", { class: "msg " + role });
      node.append(richText(text));
      this.log.append(node);
      return node;
    }

    renderAll() {
      this.log.replaceChildren();
      if (this.greeting) this.bubble("greeting", this.greeting);
      for (const m of this.messages) this.bubble(m.role, m.content);
      this.log.scrollTop = this.log.scrollHeight;
    }

    showStatus(text, retry) {
      this.status.replaceChildren(document.createTextNode(text));
      if (retry) {
        const button = el("button", { type: "button", class: "retry" }, "Retry");
        button.addEventListener("click", () => {
          this.clearStatus();
          retry();
        });
        this.status.append(button);
      }
    }

    /** A tool the gateway runs for the tenant: its status line while it runs (kvgate_tool_status). */
    toolStatus(tool) {
      if (tool.state === "running") {
        this.showStatus(String(tool.text || "Working..."));
        this.status.classList.add("tool");
      } else if (this.status.classList.contains("tool")) {
        this.status.classList.remove("tool");
        this.clearStatus();
      }
    }

    clearStatus() {
      if (this.countdown) clearInterval(this.countdown);
      this.countdown = null;
      this.status.replaceChildren();
    }

    fail(text, retry) {
      this.showStatus(text, retry);
      this.setState("error");
      this.setBusy(false);
    }

    setBusy(busy) {
      this.send.disabled = busy || !this.usable || this.countdown !== null;
      this.stop.hidden = !busy;
      this.send.hidden = busy;
    }

    async reset() {
      if (this.controller) this.controller.abort();
      if (this.onServer) {
        this.clearStatus();
        try {
          this.showConversation(await this.history("POST", "/v1/widget/conversations"));
        } catch (err) {
          return this.fail("A new conversation could not be started: " + err.message, () => this.reset());
        }
        this.setBusy(false);
        this.input.focus();
        return;
      }
      this.messages = [];
      this.save();
      this.clearStatus();
      this.renderAll();
      this.setBusy(false);
      this.input.focus();
    }

    // ---- sending -----------------------------------------------------------------------------
    submit() {
      const text = this.input.value.trim();
      if (!text || this.controller || !this.usable || this.countdown) return;
      this.input.value = "";
      this.messages.push({ role: "user", content: text });
      this.save();
      this.bubble("user", text);
      this.complete();
    }

    /** The bearer: a session token from data-session-url when given, else the widget key. */
    async bearer(renew) {
      if (!opts.sessionUrl) return opts.key;
      if (!renew && this.session && Date.now() < this.session.refreshAt) return this.session.token;
      const res = await fetch(opts.sessionUrl, { method: "POST", credentials: "include", headers: { Accept: "application/json" } });
      const data = await res.json().catch(() => ({}));
      if (!res.ok || typeof data.token !== "string") throw new SessionError("Could not start a chat session.");
      const life = typeof data.expires_in === "number" ? data.expires_in * 800 : 60000;
      this.session = { token: data.token, refreshAt: Date.now() + life };
      return data.token;
    }

    async complete() {
      const controller = new AbortController();
      const convo = this.messages; // "New conversation" replaces it: a late answer is dropped
      this.controller = controller;
      this.clearStatus();
      this.setBusy(true);
      this.setState("streaming");
      const node = this.bubble("assistant", "");
      node.setAttribute("aria-busy", "true"); // screen readers read the answer once, when done
      let text = "";
      let stopped = false;
      try {
        const id = this.onServer ? await this.conversationId() : null;
        let res = await this.post(await this.bearer(false), controller, id);
        if (res.status === 401 && opts.sessionUrl) res = await this.post(await this.bearer(true), controller, id);
        if (!res.ok) return await this.httpError(res, node);
        text = await this.readStream(res, node, controller);
      } catch (err) {
        if (err && err.name === "AbortError") stopped = true;
        else if (err instanceof StreamError) {
          node.remove();
          this.fail(err.message, () => this.complete());
          return;
        } else {
          node.remove();
          const why = err instanceof SessionError || err instanceof HistoryError ? err.message : "Network error: the message was not answered.";
          this.fail(why, () => this.complete());
          return;
        }
        text = node.textContent;
      } finally {
        if (this.status.classList.contains("tool")) this.toolStatus({ state: "done" });
        node.removeAttribute("aria-busy");
        if (this.controller === controller) this.controller = null;
        this.setBusy(false);
      }
      if (stopped) node.classList.add("stopped");
      if (convo !== this.messages) return;
      if (text) {
        convo.push({ role: "assistant", content: text });
        this.save();
      } else if (!stopped) node.remove();
      if (this.host.getAttribute("data-state") === "streaming") this.setState(stopped ? "stopped" : "ready");
    }

    post(bearer, controller, conversation) {
      const messages = this.messages.slice(-HISTORY);
      const body = { model: this.model, messages, stream: true, stream_options: { include_usage: true } };
      const max = parseInt(opts.maxTokens || "", 10);
      if (max > 0) body.max_tokens = max;
      const temperature = parseFloat(opts.temperature || "");
      if (temperature >= 0) body.temperature = temperature;
      const headers = { Authorization: "Bearer " + bearer, "Content-Type": "application/json" };
      if (conversation) headers["X-Kvgate-Conversation"] = conversation; // the server keeps the turn
      return fetch(BASE + "/v1/chat/completions", {
        method: "POST",
        credentials: "omit",
        headers,
        body: JSON.stringify(body),
        signal: controller.signal,
      });
    }

    /** Server-sent events: "data: {json}" blocks separated by blank lines, "data: [DONE]" last. */
    async readStream(res, node, controller) {
      const reader = res.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      let text = "";
      controller.signal.addEventListener("abort", () => reader.cancel().catch(() => {}));
      for (;;) {
        const { done, value } = await reader.read();
        if (controller.signal.aborted) throw new DOMException("stopped", "AbortError");
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        const events = buffer.split(/\r?\n\r?\n/);
        buffer = events.pop();
        for (const event of events) {
          const data = event.split(/\r?\n/).filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, "")).join("\n");
          if (!data || data === "[DONE]") continue;
          let obj;
          try {
            obj = JSON.parse(data);
          } catch (_) {
            continue;
          }
          if (obj.error) throw new StreamError("The answer was interrupted: " + (obj.error.message || "server error"));
          if (obj.kvgate_tool_status) this.toolStatus(obj.kvgate_tool_status);
          const delta = obj.choices && obj.choices[0] && obj.choices[0].delta;
          if (delta && typeof delta.content === "string" && delta.content) {
            text += delta.content;
            node.replaceChildren(richText(text));
            this.log.scrollTop = this.log.scrollHeight;
          }
          if (obj.usage) this.reportUsage(obj.usage);
        }
      }
      return text;
    }

    reportUsage(usage) {
      const details = usage.prompt_tokens_details || {};
      const out = {
        prompt_tokens: usage.prompt_tokens | 0,
        completion_tokens: usage.completion_tokens | 0,
        total_tokens: usage.total_tokens | 0,
        cached_tokens: details.cached_tokens | 0,
      };
      for (const [name, value] of Object.entries(out)) this.host.setAttribute("data-usage-" + name.replace(/_/g, "-"), String(value));
      this.host.dispatchEvent(new CustomEvent("kvgate:usage", { detail: out }));
    }

    async httpError(res, node) {
      node.remove();
      const data = await res.json().catch(() => ({}));
      const message = (data.error && data.error.message) || "HTTP " + res.status;
      if (res.status === 429) return this.rateLimited(parseInt(res.headers.get("Retry-After") || "", 10));
      if (res.status === 403 && data.error && data.error.code === "origin_not_allowed") {
        this.usable = false;
        return this.fail("This chat is not allowed on this site (origin not allowed).", null);
      }
      this.fail("The message was not answered: " + message, () => this.complete());
    }

    rateLimited(seconds) {
      let left = seconds > 0 ? seconds : 5;
      this.setState("rate-limited");
      const tick = () => {
        this.status.replaceChildren(document.createTextNode("Too many messages. You can send again in " + left + " s."));
        this.status.setAttribute("data-retry-after", String(left));
      };
      tick();
      this.countdown = setInterval(() => {
        left -= 1;
        if (left > 0) return tick();
        this.clearStatus();
        this.status.removeAttribute("data-retry-after");
        this.setBusy(false);
        this.setState("ready");
        this.showStatus("You can send again.", () => this.complete());
      }, 1000);
      this.setBusy(false);
    }
  }

  class StreamError extends Error {}
  class SessionError extends Error {}
  class HistoryError extends Error {}

  function start() {
    const widget = new Widget();
    widget.loadConfig();
  }
  if (document.body) start();
  else document.addEventListener("DOMContentLoaded", start, { once: true });
})();
