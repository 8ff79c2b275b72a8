// Live status on an execution's page: the execution's stream (server-sent events, the same
// as /v1's) recolours the DAG's nodes and the status pills as they change, without a reload.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  var pill = document.getElementById("execution-status");
  if (!pill || !pill.dataset.live) { return; }
  function setStatus(el, status) {
    el.className = el.className.replace(/\bstatus-[a-z_]+/g, "") + " status-" + status;
  }
  var source = new EventSource(pill.dataset.live);
  source.addEventListener("node", function (message) {
    var data = JSON.parse(message.data);
    document.querySelectorAll('[data-node="' + CSS.escape(data.node_id) + '"]').forEach(function (g) {
      setStatus(g, data.status);
      var text = g.querySelector("text.status");
      if (text) { text.textContent = data.status; }
    });
    document.querySelectorAll('[data-node-status="' + CSS.escape(data.node_id) + '"]').forEach(function (el) {
      setStatus(el, data.status);
      el.textContent = data.status;
    });
  });
  source.addEventListener("execution", function (message) {
    var status = JSON.parse(message.data).status;
    setStatus(pill, status);
    pill.textContent = status;
    if (["completed", "failed", "cancelled"].indexOf(status) >= 0) {
      source.close();
      pill.dataset.finished = "true";
    }
  });
});
