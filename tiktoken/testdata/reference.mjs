// reference.mjs computes the reference prompt tokens of each request in
// sample/ with OpenAI's own tokenizer (the npm package tiktoken: its Rust
// core built to WebAssembly, vocabularies included) and OpenAI's documented
// chat-format rules, and writes them to truth.json, which the Go tests
// read. It shares no code with the package under test. To run it again
// after changing the sample:
//
//	cd tiktoken/testdata && npm install --no-save tiktoken@1.0.22 && node reference.mjs
//
// (node_modules is ignored by git.)
//
// The rules, as OpenAI's cookbook ("How to count tokens with tiktoken")
// gives them and checked there against the prompt_tokens the API reported:
// 3 tokens per message, the tokens of each of its values (role, content,
// name), 1 more for a name, 3 priming the reply; tools counted by the
// cookbook's num_tokens_for_tools. The text parts of a content array count
// as their texts; an image counts as OpenAI's vision guide computes it for
// GPT-4o (85 at detail "low", else 85 + 170 per 512-pixel tile once the
// image is scaled to fit in 2048 x 2048 and then to a shortest side of at
// most 768), its size read from the PNG itself or, for a URL, from the
// sample's image_sizes.
import { readFileSync, readdirSync, writeFileSync } from "node:fs";
import { createHash } from "node:crypto";
import { get_encoding, encoding_for_model } from "tiktoken";

const encodings = {};
function encodingOf(model) {
	let name;
	try {
		const e = encoding_for_model(model);
		name = e.name;
		e.free();
	} catch {
		name = "o200k_base"; // the cookbook's fallback
	}
	return (encodings[name] ??= get_encoding(name));
}
// Special tokens written in text are text, as the API reads them.
const count = (enc, s) => enc.encode(s, [], []).length;

function pngSize(url) {
	const b = Buffer.from(url.slice(url.indexOf(",") + 1), "base64");
	return [b.readUInt32BE(16), b.readUInt32BE(20)];
}

function imageTokens(part, sizes) {
	const { url, detail } = part.image_url;
	if (detail === "low") return 85;
	let [w, h] = url.startsWith("data:image/png;base64,") ? pngSize(url) : sizes[url];
	if (Math.max(w, h) > 2048) {
		const r = 2048 / Math.max(w, h);
		[w, h] = [w * r, h * r];
	}
	if (Math.min(w, h) > 768) {
		const r = 768 / Math.min(w, h);
		[w, h] = [w * r, h * r];
	}
	return 85 + 170 * Math.ceil(w / 512) * Math.ceil(h / 512);
}

function messagesTokens(enc, messages, sizes) {
	let n = 0;
	for (const m of messages) {
		n += 3;
		for (const [key, value] of Object.entries(m)) {
			if (typeof value === "string") n += count(enc, value);
			else for (const part of value) n += part.type === "text" ? count(enc, part.text) : imageTokens(part, sizes);
			if (key === "name") n += 1;
		}
	}
	return n + 3;
}

// The cookbook's num_tokens_for_tools, for the flat schemas of the sample.
function toolsTokens(enc, tools, model) {
	if (!tools || tools.length === 0) return 0;
	const o200k = enc.name === "o200k_base";
	const [funcInit, propInit, propKey, enumInit, enumItem, funcEnd] = [o200k ? 7 : 10, 3, 3, -3, 3, 12];
	let n = 0;
	for (const { function: f } of tools) {
		n += funcInit;
		n += count(enc, f.name + ":" + f.description.replace(/\.$/, ""));
		const props = f.parameters.properties;
		if (Object.keys(props).length > 0) {
			n += propInit;
			for (const [key, p] of Object.entries(props)) {
				n += propKey;
				if (p.enum) {
					n += enumInit;
					for (const item of p.enum) n += enumItem + count(enc, item);
				}
				n += count(enc, `${key}:${p.type}:${p.description.replace(/\.$/, "")}`);
			}
		}
	}
	return n + funcEnd;
}

// The rules first reproduce the counts the API reported for the cookbook's
// examples, or nothing is written.
for (const c of JSON.parse(readFileSync("cookbook.json")).cases) {
	const enc = encodingOf(c.request.model);
	const got = messagesTokens(enc, c.request.messages, {}) + toolsTokens(enc, c.request.tools, c.request.model);
	if (got !== c.api_prompt_tokens) {
		console.error(`${c.name}: ${got} tokens, the API reported ${c.api_prompt_tokens}`);
		process.exit(1);
	}
}

const truth = {};
for (const file of readdirSync("sample").filter((f) => f.endsWith(".json")).sort()) {
	const data = readFileSync(`sample/${file}`);
	const doc = JSON.parse(data);
	const req = doc.request;
	const enc = encodingOf(req.model);
	truth[file] = {
		sha256: createHash("sha256").update(data).digest("hex"),
		encoding: enc.name,
		prompt_tokens: messagesTokens(enc, req.messages, doc.image_sizes ?? {}) + toolsTokens(enc, req.tools, req.model),
	};
}

// Strings whose counts the Go tests compare with the Go tokenizer's, whole
// and in chunks: edge cases of the splitting patterns.
const strings = [
	"hello world", "tiktoken is great!", "antidisestablishmentarianism", "2 + 2 = 4", "お誕生日おめでとう",
	" \n".repeat(300), "\n ".repeat(300) + "x", " ".repeat(700) + "word", "\t \r\n".repeat(200),
	"😀".repeat(200), "👨‍👩‍👧‍👦".repeat(40), "a".repeat(1000), "A".repeat(999) + "b", "7".repeat(1000),
	"'s".repeat(400), "It's they're we've I'm you'll he'd ".repeat(30), "IT'S THEY'RE ".repeat(60),
	"0123456789abcdef".repeat(80), "éèêë àâä ôö ûü ç ".repeat(60), "e\u0301".repeat(400),
	"{\"a\":[1,2,{\"b\":null}],\"c\":\"d\"}".repeat(50), "<|endoftext|> plain text <|endofprompt|>",
	"日本語のテキストと English の mix、そして数字 12345 も。".repeat(20), "Ǆǅǆ ǈǉ ǋǌ".repeat(50), "١٢٣٤٥ ٦٧٨٩".repeat(50),
];
const o200k = (encodings.o200k_base ??= get_encoding("o200k_base"));
const cl100k = (encodings.cl100k_base ??= get_encoding("cl100k_base"));
const vectors = strings.map((s) => ({ text: s, o200k_base: count(o200k, s), cl100k_base: count(cl100k, s) }));

writeFileSync("truth.json", JSON.stringify({ tokenizer: "tiktoken@1.0.22 (npm)", requests: truth, strings: vectors }, null, 1) + "\n");
console.log(`${Object.keys(truth).length} requests, ${vectors.length} strings`);
