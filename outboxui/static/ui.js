// outboxui: optional enhancements. Every page works without this script.
(function () {
  "use strict";
  document.documentElement.classList.add("js");
  document.addEventListener("change", function (e) {
    var t = e.target;
    if (!t.classList || !t.classList.contains("select-all")) return;
    var form = t.closest("form");
    form.querySelectorAll('input[type=checkbox][name=id]').forEach(function (box) { box.checked = t.checked; });
  });
})();
