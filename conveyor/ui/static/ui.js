// Live status on an execution's page: the execution's stream (server-sent events, the same
// as /v1's) recolours the DAG's nodes and the status pills as they change, without a reload.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  var pill = document.getElementById("execution-status");
  if (!pill || !pill.dataset.live) { return; }
  function setStatus(el, status) {  // SVG elements too: their className is not a string
    var kept = (el.getAttribute("class") || "").replace(/\bstatus-[a-z_]+/g, "").trim();
    el.setAttribute("class", kept + " status-" + status);
  }
  var source = new EventSource(pill.dataset.live);
  var heard = {};  // nodes an event told of since the statuses were asked for
  function showNode(data) {
    document.querySelectorAll('[data-node="' + CSS.escape(data.node_id) + '"]').forEach(function (g) {
      setStatus(g, data.status);
      var text = g.querySelector("text.status");
      // a map node keeps its items' counts after its status (" · 2/3 items")
      if (text) { text.textContent = data.status + text.textContent.replace(/^[^·]*/, " ").trimEnd(); }
    });
    document.querySelectorAll('[data-node-status="' + CSS.escape(data.node_id) + '"]').forEach(function (el) {
      setStatus(el, data.status);
      el.textContent = data.status;
    });    var detail = document.getElementById("node-" + data.node_id);
    if (data.status === "waiting" && detail && detail.hasAttribute("data-asks-approval")) {
      // An approval that began waiting after this page was drawn: its Approve and Reject
      // buttons come with the page. Once per node, should the page still lack them.
      var once = "conveyor-approval:" + pill.dataset.live + ":" + data.node_id;
      if (!sessionStorage.getItem(once)) { sessionStorage.setItem(once, "1"); location.reload(); }
    }
  }
  source.addEventListener("node", function (message) {
    var data = JSON.parse(message.data);
    heard[data.node_id] = true;
    showNode(data);
  });
  // The stream tells of changes after it opened; what changed between this page's render and
  // then is read once, as soon as it opened (a node an event told of since is left alone).
  source.addEventListener("execution", function () {
    if (heard.asked) { return; }
    heard = {asked: true};
    fetch(pill.dataset.live.replace(/events$/, "statuses")).then(function (r) {
      return r.ok ? r.json() : {};
    }).then(function (statuses) {
      Object.keys(statuses).forEach(function (node) {
        if (!heard[node]) { showNode({node_id: node, status: statuses[node]}); }
      });
    });
  });
  source.addEventListener("execution", function (message) {
    var status = JSON.parse(message.data).status;
    setStatus(pill, status);
    pill.textContent = status;
    if (["completed", "failed", "cancelled"].indexOf(status) >= 0) {
      source.close();
      pill.dataset.finished = "true";
      var cancel = document.getElementById("cancel");  // nothing left to cancel
      if (cancel) { cancel.disabled = true; cancel.title = "It has finished: reload to rerun it."; }
    }
  });
});

// The operators' overview: its figures (JSON) fetched every few seconds and drawn as SVG.
document.addEventListener("DOMContentLoaded", function () {
  var box = document.getElementById("operator-overview");
  if (!box) { return; }
  var NS = "http://www.w3.org/2000/svg";
  function shape(svg, name, attrs, title) {
    var el = document.createElementNS(NS, name);
    Object.keys(attrs).forEach(function (k) { el.setAttribute(k, attrs[k]); });
    if (title) { var t = document.createElementNS(NS, "title"); t.textContent = title; el.appendChild(t); }
    svg.appendChild(el);
    return el;
  }
  // bars: [{label, parts: [{value, cls}]}]: stacked bars, scaled to the tallest
  function bars(svg, rows) {
    while (svg.firstChild) { svg.removeChild(svg.firstChild); }
    var w = +svg.getAttribute("width"), h = +svg.getAttribute("height") - 16;
    var top = Math.max(1, Math.max.apply(null, rows.map(function (r) {
      return r.parts.reduce(function (a, p) { return a + p.value; }, 0); })));
    var bw = w / Math.max(1, rows.length);
    rows.forEach(function (r, i) {
      var y = h;
      r.parts.forEach(function (p) {
        var ph = h * p.value / top;
        y -= ph;
        if (ph > 0) { shape(svg, "rect", {x: i * bw + 1, y: y, width: bw - 2, height: ph, "class": p.cls}, r.label + ": " + p.value); }
      });
      shape(svg, "text", {x: i * bw + bw / 2, y: h + 12, "text-anchor": "middle", "class": "axis"}).textContent = r.short;
    });
    shape(svg, "text", {x: 2, y: 10, "class": "axis"}).textContent = "max " + (Math.round(top * 100) / 100);
  }
  function seconds(v) { return v === null ? "—" : v.toFixed(2) + " s"; }
  function draw(f) {
    document.getElementById("figures-taken").textContent = "at " + f.taken_at.slice(11, 19) + " UTC";
    bars(document.getElementById("chart-throughput"), f.steps.map(function (s) {
      return {label: s.start.slice(11, 16), short: s.start.slice(11, 16),
              parts: [{value: s.succeeded, cls: "status-completed"}, {value: s.failed, cls: "status-failed"}]};
    }));
    bars(document.getElementById("chart-errors"), f.steps.map(function (s) {
      return {label: s.start.slice(11, 16), short: s.start.slice(11, 16),
              parts: [{value: s.error_rate || 0, cls: "status-failed"}]};
    }));
    bars(document.getElementById("chart-queues"), (f.queues || []).map(function (q) {
      var name = q.queue.replace("workflow-", "") + " " + q.priority;
      var short = q.queue.replace("workflow-", "").slice(0, 4) + "·" + q.priority.charAt(0);
      return {label: name, short: short, parts: [{value: q.depth, cls: "status-queued"}]};
    }));
    document.getElementById("latency-p50").textContent = seconds(f.latency.p50);
    document.getElementById("latency-p95").textContent = seconds(f.latency.p95);
    document.getElementById("latency-count").textContent = f.latency.count;
    var body = document.querySelector("#limits tbody");
    body.innerHTML = "";
    f.limits.forEach(function (l) {
      var tr = body.insertRow();
      [l.scope, l.name, l.in_use, l.limit, l.waiting].forEach(function (v) { tr.insertCell().textContent = v; });
    });
    var alerts = document.getElementById("alerts");
    alerts.innerHTML = "";
    (f.alerts.length ? f.alerts : ["none"]).forEach(function (a) {
      var li = document.createElement("li"); li.textContent = a; alerts.appendChild(li);
    });
    box.dataset.drawn = f.taken_at;
  }
  function refresh() {
    fetch(box.dataset.figures, {credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (f) { if (f) { draw(f); } })
      .catch(function () {});
  }
  refresh();
  setInterval(refresh, 5000);
});
