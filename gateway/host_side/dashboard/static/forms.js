// Tool forms generated from a tool's inputSchema, a raw-JSON mode, and call results rendered.
// No framework: each form is built once with DOM calls; values never pass through innerHTML.
"use strict";

const Forms = (() => {
  function el(tag, attributes = {}, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attributes)) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "text") node.textContent = value;
      else if (key === "class") node.className = value;
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children) node.append(child);
    return node;
  }

  // One input for one property; returns {node, read} where read() gives [present, value].
  function field(name, schema, required) {
    const label = el("label", {class: "field"});
    const title = el("span", {class: "name", text: name + (required ? " *" : "")});
    label.append(title);
    const hint = [];
    const type = Array.isArray(schema.type) ? schema.type.find((t) => t !== "null") : schema.type;
    let input;
    let read;
    if (Array.isArray(schema.enum)) {
      input = el("select", {name});
      if (!required || schema.default === undefined) input.append(el("option", {value: "", text: "(none)"}));
      schema.enum.forEach((value, index) => {
        const option = el("option", {value: String(index), text: typeof value === "string" ? value : JSON.stringify(value)});
        if (JSON.stringify(value) === JSON.stringify(schema.default)) option.selected = true;
        input.append(option);
      });
      read = () => input.value === "" ? [false] : [true, schema.enum[Number(input.value)]];
    } else if (type === "boolean") {
      if (required || schema.default !== undefined) {
        input = el("input", {type: "checkbox", name, checked: schema.default === true});
        read = () => [true, input.checked];
      } else {
        input = el("select", {name}, el("option", {value: "", text: "(none)"}),
          el("option", {value: "true", text: "true"}), el("option", {value: "false", text: "false"}));
        read = () => input.value === "" ? [false] : [true, input.value === "true"];
      }
    } else if (type === "integer" || type === "number") {
      const integer = type === "integer";
      input = el("input", {type: "number", name, step: integer ? "1" : "any",
        min: schema.minimum, max: schema.maximum, value: schema.default, required});
      if (schema.minimum !== undefined || schema.maximum !== undefined) {
        hint.push(`${schema.minimum ?? "…"} to ${schema.maximum ?? "…"}`);
      }
      read = () => {
        if (input.value.trim() === "") return [false];
        const value = Number(input.value);
        if (!Number.isFinite(value) || (integer && !Number.isInteger(value))) {
          throw new Error(`${name} must be ${integer ? "a whole number" : "a number"}`);
        }
        if (schema.minimum !== undefined && value < schema.minimum) throw new Error(`${name} must be at least ${schema.minimum}`);
        if (schema.maximum !== undefined && value > schema.maximum) throw new Error(`${name} must be at most ${schema.maximum}`);
        return [true, value];
      };
    } else if (type === "string") {
      input = el("input", {type: "text", name, value: schema.default, maxlength: schema.maxLength, required});
      read = () => input.value === "" && !required ? [false] : [true, input.value];
    } else {  // objects, arrays, anything else: JSON
      input = el("textarea", {name, rows: 2, placeholder: "JSON"});
      if (schema.default !== undefined) input.value = JSON.stringify(schema.default);
      hint.push("JSON");
      read = () => {
        if (input.value.trim() === "") return [false];
        try { return [true, JSON.parse(input.value)]; } catch { throw new Error(`${name} is not valid JSON`); }
      };
    }
    label.append(input);
    if (schema.description) hint.unshift(schema.description);
    if (hint.length) label.append(el("small", {text: hint.join(" · ")}));
    return {node: label, read};
  }

  // A form for one tool; onSubmit(arguments) is awaited and its result rendered below.
  function build(tool, onSubmit) {
    const schema = tool.inputSchema || {};
    const properties = schema.properties || {};
    const required = new Set(schema.required || []);
    const form = el("form", {class: "tool", "data-tool": tool.tool, novalidate: true});
    const fields = Object.entries(properties).map(([name, property]) => [name, field(name, property || {}, required.has(name))]);
    const structured = el("div", {class: "fields"});
    fields.forEach(([, f]) => structured.append(f.node));
    const raw = el("textarea", {class: "raw", name: "__raw", rows: 4, hidden: true});
    const rawToggle = el("input", {type: "checkbox", class: "raw-toggle"});
    const read = () => {
      if (rawToggle.checked) {
        let value;
        try { value = JSON.parse(raw.value || "{}"); } catch { throw new Error("the arguments are not valid JSON"); }
        if (typeof value !== "object" || value === null || Array.isArray(value)) throw new Error("the arguments must be a JSON object");
        return value;
      }
      const args = {};
      for (const [name, f] of fields) {
        const [present, value] = f.read();
        if (present) args[name] = value;
        else if (required.has(name)) throw new Error(`${name} is required`);
      }
      return args;
    };
    rawToggle.addEventListener("change", () => {
      if (rawToggle.checked) {
        try { raw.value = JSON.stringify(read.call(null), null, 2); } catch { raw.value = "{}"; }
      }
      raw.hidden = !rawToggle.checked;
      structured.hidden = rawToggle.checked;
    });
    const result = el("div", {class: "result", "aria-live": "polite"});
    const button = el("button", {type: "submit", text: "Call"});
    form.append(structured, raw, el("div", {class: "actions"}, button,
      el("label", {class: "inline"}, rawToggle, " raw JSON")), result);
    // The button's click, not the form's submit: a sandboxed frame without allow-forms (the
    // MCP Apps panel in a host) never fires submit. Enter in a field clicks it too.
    form.addEventListener("submit", (event) => event.preventDefault());
    button.addEventListener("click", async (event) => {
      event.preventDefault();
      result.replaceChildren();
      let args;
      try { args = read(); } catch (error) { result.append(el("p", {class: "error", text: error.message})); return; }
      button.disabled = true;
      try {
        render(result, await onSubmit(args));
      } catch (error) {
        result.append(el("p", {class: "error", text: error.message}));
      } finally {
        button.disabled = false;
      }
    });
    return form;
  }

  // A tools/call result: text (JSON pretty-printed), images inline, anything else as JSON.
  function render(container, result) {
    container.replaceChildren();
    const blocks = Array.isArray(result.content) ? result.content : [];
    if (result.isError) container.append(el("p", {class: "error", text: "The device answered with an error:"}));
    for (const block of blocks) {
      if (block.type === "text") {
        let text = block.text;
        try {
          const parsed = JSON.parse(text);
          if (typeof parsed === "object" && parsed !== null) text = JSON.stringify(parsed, null, 2);
        } catch { /* plain text */ }
        container.append(el("pre", {class: "text", text}));
      } else if (block.type === "image" && typeof block.data === "string" && /^image\/[\w.+-]+$/.test(block.mimeType || "")) {
        container.append(el("img", {class: "image", alt: "image from the device", src: `data:${block.mimeType};base64,${block.data}`}));
      } else if (block.type === "resource_link" && typeof block.uri === "string") {
        // The photo's MCP resource: hosts read it; here it is on the Photos page.
        container.append(el("p", {class: "note", text: `kept as ${block.uri} (see Photos)`}));
      } else {
        container.append(el("pre", {class: "json", text: JSON.stringify(block, null, 2)}));
      }
    }
    if (result.structuredContent !== undefined && !blocks.length) {
      container.append(el("pre", {class: "json", text: JSON.stringify(result.structuredContent, null, 2)}));
    }
    if (!blocks.length && result.structuredContent === undefined) container.append(el("p", {class: "note", text: "(no content)"}));
  }

  return {build, render, el};
})();
