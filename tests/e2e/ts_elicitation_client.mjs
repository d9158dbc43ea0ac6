// A host built on the TypeScript MCP SDK (@modelcontextprotocol/sdk) that declares form
// elicitation and answers every elicitation/create with an explicit yes, as Claude Code's or VS
// Code's prompt does when the person clicks Allow. Driven by tests/e2e/test_confirmations.py.
//
// node ts_elicitation_client.mjs NODE_MODULES MCP_URL TOOL ARGUMENTS_JSON
// Says (stdout, one JSON object): {"asked": [{message, requestedSchema}], "result": CallToolResult}.
import { createRequire } from "node:module";
import { join } from "node:path";

const [modules, mcpUrl, tool, argumentsJson] = process.argv.slice(2);
// The packages live in .ci/node (tests/programs.py), not beside this script.
const require = createRequire(join(modules, "resolve-from-here.js"));
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = require(
  "@modelcontextprotocol/sdk/client/streamableHttp.js",
);
const { ElicitRequestSchema } = require("@modelcontextprotocol/sdk/types.js");

const client = new Client(
  { name: "ts-elicitation-host", version: "1.0.0" },
  { capabilities: { elicitation: { form: {} } } },
);
const asked = [];
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  asked.push({ message: request.params.message, requestedSchema: request.params.requestedSchema });
  return { action: "accept", content: { confirm: true } };
});
await client.connect(new StreamableHTTPClientTransport(new URL(mcpUrl)));
const result = await client.callTool({ name: tool, arguments: JSON.parse(argumentsJson) });
process.stdout.write(`${JSON.stringify({ asked, result })}\n`);
await client.close();
