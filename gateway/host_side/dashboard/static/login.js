// Exchanges the host token for a session cookie (HttpOnly: this page never sees it).
"use strict";
document.getElementById("login").addEventListener("submit", async (event) => {
  event.preventDefault();
  const error = document.getElementById("error");
  const response = await fetch("login", {
    method: "POST",
    headers: {"Content-Type": "application/json"},
    body: JSON.stringify({token: document.getElementById("token").value}),
  });
  if (response.ok) {
    location.href = "./";
    return;
  }
  const body = await response.json().catch(() => ({}));
  error.textContent = body.error || `sign-in failed (${response.status})`;
  error.hidden = false;
});
