// A board played by the MCP TypeScript SDK's server (@modelcontextprotocol/sdk, from npm):
// streamable HTTP at /mcp on 127.0.0.1, a port of the system's choosing, printed on stdout.
// Tools: greet (text), take_photo (an image), slow (answers after 60 s), grow (adds "extra").
const http = require("node:http");
const { randomUUID } = require("node:crypto");
const { McpServer } = require("@modelcontextprotocol/sdk/server/mcp.js");
const { StreamableHTTPServerTransport } = require("@modelcontextprotocol/sdk/server/streamableHttp.js");
const z = require("zod");

const PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4z8DwHwAFAAH/iZk9HQAAAABJRU5ErkJggg==";
const name = process.argv[2] || "ts-board";

function board() {
  const server = new McpServer({ name, version: "1.0.0" });
  server.registerTool("greet", { description: "Greet someone by name.", inputSchema: { who: z.string() } },
    async ({ who }) => ({ content: [{ type: "text", text: `hello ${who} from ${name}` }] }));
  server.registerTool("take_photo", { description: "Take a photo." },
    async () => ({ content: [{ type: "image", data: PNG, mimeType: "image/png" }] }));
  server.registerTool("slow", { description: "Answer after a minute." },
    async () => { await new Promise((done) => setTimeout(done, 60000)); return { content: [{ type: "text", text: "done" }] }; });
  server.registerTool("grow", { description: "Add a tool named extra." }, async () => {
    server.registerTool("extra", { description: "Added at run time." },
      async () => ({ content: [{ type: "text", text: "extra!" }] }));  // tells the client itself
    return { content: [{ type: "text", text: "grown" }] };
  });
  return server;
}

const sessions = new Map();
http.createServer(async (req, res) => {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString()) : undefined;
  let transport = sessions.get(req.headers["mcp-session-id"]);
  if (!transport) {
    transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      onsessioninitialized: (id) => sessions.set(id, transport),
    });
    await board().connect(transport);
  }
  await transport.handleRequest(req, res, body);
}).listen(0, "127.0.0.1", function () {
  process.stdout.write(`${this.address().port}\n`);
});
