// The console's login: presents the token once; the server answers with a session cookie.
"use strict";
document.getElementById("login").addEventListener("submit", async (event) => {
  event.preventDefault();
  const error = document.getElementById("login-error");
  const token = document.getElementById("token").value;
  const answer = await fetch("/login", {headers: {Authorization: "Bearer " + token}, credentials: "same-origin"});
  if (answer.ok) {
    location.replace("/");
  } else {
    error.textContent = "Wrong token.";
    error.hidden = false;
  }
});
