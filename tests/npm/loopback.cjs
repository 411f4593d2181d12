// Preloaded into npm servers (NODE_OPTIONS="--require .../loopback.cjs") that bind every interface:
// binds their listening sockets to 127.0.0.1 instead, and writes the port each one got (port 0 picks
// a free one) to the file named by MCP_TEST_PORT_FILE, so a test can find the server.
"use strict";
const fs = require("fs");
const net = require("net");

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const first = args[0];
  if (typeof first === "number" || (typeof first === "string" && /^\d+$/.test(first))) {
    const callback = args.find((arg) => typeof arg === "function");
    args = [{ port: Number(first), host: "127.0.0.1" }, ...(callback ? [callback] : [])];
  } else if (first !== null && typeof first === "object" && !(first instanceof net.Server)) {
    args[0] = { ...first, host: "127.0.0.1" };
  }
  const portFile = process.env.MCP_TEST_PORT_FILE;
  if (portFile) {
    this.once("listening", () => fs.writeFileSync(portFile, String(this.address().port)));
  }
  return listen.apply(this, args);
};
