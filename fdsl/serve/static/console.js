// fdsl serve: the console of the GPT Utility Manual. Every text from the server is put on the
// page with textContent (never as markup); math goes through KaTeX (trust off), pictures are
// <img> of base64 SVG, so nothing a command types becomes markup or script here.
"use strict";

(function () {
  const HISTORY_KEY = "fdsl-serve-history";
  const HISTORY_MAX = 500;
  const $ = (id) => document.getElementById(id);
  const input = $("input"), results = $("results"), log = $("log");
  let session = null, running = false;
  let history = [];
  try { history = JSON.parse(localStorage.getItem(HISTORY_KEY) || "[]"); } catch (e) { history = []; }
  if (!Array.isArray(history)) history = [];
  let place = history.length, draft = "";

  function call(name, body) {
    // relative to /TOKEN/: the token travels in the path
    return fetch("api/" + name, {method: "POST", headers: {"Content-Type": "application/json"},
                                 body: JSON.stringify(body || {})})
      .then((r) => r.json().catch(() => ({error: "the server answered " + r.status})));
  }

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function typeset(item, into) {
    const box = el("div", "math");
    try {
      katex.render(item.latex, box, {displayMode: true, throwOnError: true, trust: false, strict: "ignore",
                                     maxExpand: 10000, output: "htmlAndMathml"});
      into.appendChild(box);
      const more = el("details");
      more.appendChild(el("summary", null, "text"));
      more.appendChild(el("pre", null, item.text));
      into.appendChild(more);
    } catch (e) {  // KaTeX could not set it: the printer's text instead
      into.appendChild(el("pre", null, item.text));
    }
  }

  function picture(src, caption, entry) {
    const img = el("img");
    img.alt = caption || "picture";
    img.src = src;
    entry.appendChild(img);
    entry.appendChild(el("div", "caption", caption || ""));
  }

  function download(item, entry) {
    // a file the command wrote in the session's folder, served by files/SESSION/NAME as an attachment
    const name = String(item.path);
    const link = el("a", "download", "download " + name);
    link.href = "files/" + encodeURIComponent(session) + "/" + name.split("/").map(encodeURIComponent).join("/");
    link.download = name.split("/").pop();
    const line = el("div", "file");
    line.appendChild(link);
    if (typeof item.bytes === "number") line.appendChild(el("span", "size", " (" + item.bytes + " bytes)"));
    entry.appendChild(line);
  }

  function render(items, entry) {
    // an error stays under its command; the grey box holds the logs (traces) of the last one
    log.textContent = "";
    for (const item of items || []) {
      if (item.kind === "math") typeset(item, entry);
      else if (item.kind === "svg") picture("data:image/svg+xml;base64," + item.svg, item.caption, entry);
      else if (item.kind === "png") picture("data:image/png;base64," + item.png, item.caption, entry);
      else if (item.kind === "file") download(item, entry);
      else if (item.kind === "error") entry.appendChild(el("pre", "error", item.text));
      else if (item.kind === "log") log.appendChild(el("pre", "log", item.text));
      else entry.appendChild(el("pre", null, item.text));
    }
    results.scrollTop = results.scrollHeight;
  }

  function busy(on, what) {
    running = on;
    input.readOnly = on;
    $("status").hidden = !on;
    $("statustext").textContent = what || "running";
    if (!on) input.focus();
  }

  function remember(text) {
    if (history[history.length - 1] !== text) history.push(text);
    if (history.length > HISTORY_MAX) history = history.slice(-HISTORY_MAX);
    try { localStorage.setItem(HISTORY_KEY, JSON.stringify(history)); } catch (e) { /* full or off */ }
    place = history.length;
    draft = "";
  }

  function submit() {
    const text = input.value;
    if (!text.trim() || running || !session) return;
    remember(text);
    input.value = "";
    const entry = el("div", "entry");
    entry.appendChild(el("div", "cmd", text));
    results.appendChild(entry);
    results.scrollTop = results.scrollHeight;
    busy(true, "running");
    const started = Date.now();
    const timer = setInterval(() => {
      $("statustext").textContent = "running " + Math.round((Date.now() - started) / 1000) + " s";
    }, 1000);
    call("run", {id: session, input: text}).then((reply) => {
      if (reply.error) render([{kind: "error", text: reply.error}], entry);
      else render(reply.items, entry);
    }).catch((e) => render([{kind: "error", text: "no answer from the server: " + e}], entry))
      .finally(() => { clearInterval(timer); busy(false); });
  }

  function firstLine() { return input.value.lastIndexOf("\n", input.selectionStart - 1) < 0; }
  function lastLine() { return input.value.indexOf("\n", input.selectionEnd) < 0; }

  input.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      submit();
    } else if (ev.key === "ArrowUp" && firstLine() && place > 0) {
      ev.preventDefault();
      if (place === history.length) draft = input.value;
      place -= 1;
      input.value = history[place];
    } else if (ev.key === "ArrowDown" && lastLine() && place < history.length) {
      ev.preventDefault();
      place += 1;
      input.value = place === history.length ? draft : history[place];
    }
  });

  $("stop").addEventListener("click", () => {
    if (session) call("stop", {id: session});
    $("statustext").textContent = "stopping";
  });

  $("help").addEventListener("click", () => {
    const panel = $("helppanel");
    if (!panel.hidden) { panel.hidden = true; return; }
    call("help", {id: session}).then((reply) => {
      $("helptext").textContent = reply.text || reply.error || "";
      panel.hidden = false;
    });
  });

  $("reset").addEventListener("click", () => {
    if (running || !session) return;
    results.textContent = "";
    busy(true, "starting afresh");
    call("reset", {id: session}).then((reply) => {
      const entry = el("div", "entry");
      results.appendChild(entry);
      render(reply.items, entry);
    }).finally(() => busy(false));
  });

  window.addEventListener("pagehide", () => {
    if (session) navigator.sendBeacon("api/close", JSON.stringify({id: session}));
  });

  busy(true, "starting");
  call("session").then((reply) => {
    session = reply.id;
    document.body.dataset.session = session || "";
    if (reply.file) $("file").textContent = reply.file;
    const entry = el("div", "entry");
    results.appendChild(entry);
    render(reply.items, entry);
  }).finally(() => { busy(false); document.body.dataset.ready = "1"; });
})();
