// The reference encoding for tests/e2e/real_templates_e2e_test.cc: Hugging Face's tokenizer as
// transformers.js implements it (@lenml/tokenizers), on a model family's tokenizer.json.
// Usage: node encode_reference.mjs FAMILY TEXT_FILE   (FAMILY: qwen3, llama3_2, mistral_nemo)
// Prints the token ids of the file's text as a JSON array, encoded as a chat template's output
// is (no special tokens added: the template wrote them).
import { readFileSync } from "node:fs";

const [family, path] = process.argv.slice(2);
const { fromPreTrained } = await import(`@lenml/tokenizer-${family}`);
const tokenizer = fromPreTrained();
const text = readFileSync(path, "utf8");
console.log(JSON.stringify(tokenizer.encode(text, { add_special_tokens: false })));
