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
    });
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
