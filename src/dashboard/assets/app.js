// The svcgate dashboard's only script. Every page works without it; it adds a copy button
// to values shown once, and keeps a reload of such a page from submitting its form again.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  // A page that shows a key or secret once replaces its address with the list it came from:
  // reloading then shows the list, not the value (nor a second key).
  var once = document.querySelector("[data-replace-url]");
  if (once && window.history && window.history.replaceState) {
    window.history.replaceState(null, "", once.getAttribute("data-replace-url"));
  }
  document.querySelectorAll("button[data-copy]").forEach(function (button) {
    button.addEventListener("click", function () {
      var field = document.getElementById(button.getAttribute("data-copy"));
      if (!field) return;
      field.select();
      var done = function () { button.textContent = "Copied"; };
      if (navigator.clipboard && navigator.clipboard.writeText) {
        navigator.clipboard.writeText(field.value).then(done, function () {
          document.execCommand("copy");
          done();
        });
      } else {
        document.execCommand("copy");
        done();
      }
    });
  });
});
