// The dashboard's only script: confirmations and the endpoint menu. No page has inline script
// or event handlers (the Content-Security-Policy forbids them), so nothing a message carries can
// run as code: a confirmation's text is read from a data attribute and shown as text.
"use strict";
document.addEventListener("submit", (event) => {
  const button = event.submitter;
  const text = (button && button.dataset.confirm) || event.target.dataset.confirm;
  if (text && !window.confirm(text)) {
    event.preventDefault();
  }
});
document.addEventListener("change", (event) => {
  const field = event.target;
  if (field instanceof HTMLSelectElement && field.hasAttribute("data-autosubmit") && field.form) {
    field.form.submit();
  }
});
