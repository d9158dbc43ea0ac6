// An app built on the TypeScript MCP SDK's OAuth client (@modelcontextprotocol/sdk): its
// StreamableHTTPClientTransport with an OAuthClientProvider, as a desktop app wires it. Driven
// by tests/e2e/test_oauth_js.py one JSON object a line, since the owner's browser and the app's
// redirect URI are the test's (tests/oauth_helpers.py).
//
// node ts_oauth_client.mjs NODE_MODULES MCP_URL REDIRECT_URL CLIENT_NAME
// Says (stdout): {"authorize": url} when the SDK sends the owner to consent; {"client_id": id}
// once registered; {"unauthorized": url, "www_authenticate": header} for each 401 it gets;
// {"connected": true}; {"tools": [names]}; {"result": CallToolResult}; {"error": name,
// "message": text} when a request fails.
// Hears (stdin): {"code", "state", "iss"} what the redirect brought; {"list": true};
// {"call": name, "arguments": {...}}. It exits when stdin ends.
import { randomUUID } from "node:crypto";
import { createRequire } from "node:module";
import { join } from "node:path";
import { createInterface } from "node:readline";

const [modules, mcpUrl, redirectUrl, clientName] = process.argv.slice(2);
// The packages live in .ci/node (tests/programs.py), not beside this script.
const require = createRequire(join(modules, "resolve-from-here.js"));
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = require(
  "@modelcontextprotocol/sdk/client/streamableHttp.js",
);
const { UnauthorizedError } = require("@modelcontextprotocol/sdk/client/auth.js");

const say = (message) => process.stdout.write(`${JSON.stringify(message)}\n`);
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const hear = async () => {
  const { value, done } = await lines.next();
  return done ? undefined : JSON.parse(value);
};

// The SDK keeps nothing itself: an app stores the registration, the tokens and the PKCE
// verifier, and checks the state it sent came back.
class Provider {
  constructor() {
    this.client = undefined;
    this.saved = undefined;
    this.verifier = undefined;
    this.sentState = undefined;
  }
  get redirectUrl() {
    return redirectUrl;
  }
  get clientMetadata() {
    return {
      client_name: clientName,
      redirect_uris: [redirectUrl],
      grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"],
      token_endpoint_auth_method: "none", // a public client, as desktop apps register
    };
  }
  state() {
    this.sentState = randomUUID();
    return this.sentState;
  }
  clientInformation() {
    return this.client;
  }
  saveClientInformation(information) {
    this.client = information;
    say({ client_id: information.client_id });
  }
  tokens() {
    return this.saved;
  }
  saveTokens(tokens) {
    this.saved = tokens;
  }
  redirectToAuthorization(url) {
    say({ authorize: url.href });
  }
  saveCodeVerifier(verifier) {
    this.verifier = verifier;
  }
  codeVerifier() {
    return this.verifier;
  }
  // What the SDK calls when the server refuses what is stored (a revoked refresh token is
  // invalid_grant): forget it, so the SDK starts a new authorization instead of retrying it.
  invalidateCredentials(scope) {
    if (scope === "all" || scope === "client") this.client = undefined;
    if (scope === "all" || scope === "tokens") this.saved = undefined;
    if (scope === "all" || scope === "verifier") this.verifier = undefined;
  }
}

// Every 401 the app meets, with the header that points it at the authorization server.
const watched = async (url, init) => {
  const response = await fetch(url, init);
  if (response.status === 401) {
    say({ unauthorized: String(url), www_authenticate: response.headers.get("www-authenticate") });
  }
  return response;
};

const provider = new Provider();
const transport = () =>
  new StreamableHTTPClientTransport(new URL(mcpUrl), { authProvider: provider, fetch: watched });
const app = () => new Client({ name: clientName, version: "1.0.0" });

let client = app();
const first = transport();
try {
  await client.connect(first);
} catch (error) {
  if (!(error instanceof UnauthorizedError)) throw error;
  const redirect = await hear();
  if (redirect.state !== provider.sentState) throw new Error("the redirect's state is not ours");
  await first.finishAuth(redirect.code);
  client = app();
  await client.connect(transport());
}
say({ connected: true });

for (let command = await hear(); command !== undefined; command = await hear()) {
  try {
    if (command.list) {
      say({ tools: (await client.listTools()).tools.map((tool) => tool.name) });
    } else {
      say({ result: await client.callTool({ name: command.call, arguments: command.arguments }) });
    }
  } catch (error) {
    say({ error: error.constructor.name, message: String(error.message) });
  }
}
await client.close();
