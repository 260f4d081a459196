// Sign in: a token pasted into the form (or taken from a #token= link by
// console.js). The gateway checks it on the first request; a bad or expired
// token comes back here with the gateway's reason.

import { h, heading } from "../dom.js";

export function render(main, { reason, onSignIn }) {
  const input = h("textarea", {
    id: "token",
    name: "token",
    rows: "4",
    required: true,
    autocomplete: "off",
    spellcheck: "false",
    "aria-describedby": "token-help",
  });
  const form = h(
    "form",
    { class: "signin-form", id: "signin-form" },
    h("label", { for: "token" }, "Token"),
    input,
    h(
      "p",
      { class: "help", id: "token-help" },
      "A JWT the gateway accepts, as for the API: ",
      h("code", {}, "litebase-streams-gateway token --role <role>"),
      " makes one. The role decides what the console shows and allows. It is kept in this tab only.",
    ),
    h("button", { type: "submit", class: "button", id: "sign-in" }, "Sign in"),
  );
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    if (input.value.trim()) onSignIn(input.value);
  });
  main.replaceChildren(
    h(
      "section",
      { class: "signin" },
      heading("Sign in"),
      h("p", { class: "lede" }, "litebase streams console"),
      reason ? h("p", { class: "notice notice-error", role: "alert", id: "signin-reason" }, reason) : null,
      form,
    ),
  );
  input.focus();
  return null;
}
