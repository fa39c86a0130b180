#!/usr/bin/python3
"""Renders every <name>.jinja in a directory with Python's jinja2, the way Hugging Face
transformers renders chat templates, for engine/chat/jinja_differential_test.cc.

Environment: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the
loopcontrols extension, HF's `tojson` filter (json.dumps, ensure_ascii=False, no key sorting)
and the globals raise_exception and strftime_now. Templates named *.notrim.jinja are rendered
with trim_blocks and lstrip_blocks off.

Each template is rendered once per context in <name>.json (a JSON list of objects). Results go
to OUT_DIR/<name>.<i>.out (the output, UTF-8) or OUT_DIR/<name>.<i>.err (the error's type and
message) for i = 0, 1, ...

Usage: /usr/bin/python3 render_jinja.py TESTDATA_DIR OUT_DIR   (needs python3-jinja2)
"""
import json
import os
import sys
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def make_env(trim):
    env = ImmutableSandboxedEnvironment(trim_blocks=trim, lstrip_blocks=trim,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    src_dir, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    envs = {True: make_env(True), False: make_env(False)}
    for fname in sorted(os.listdir(src_dir)):
        if not fname.endswith(".jinja"):
            continue
        name = fname[:-len(".jinja")]
        with open(os.path.join(src_dir, fname), encoding="utf-8", newline="") as f:
            source = f.read()
        with open(os.path.join(src_dir, name + ".json"), encoding="utf-8") as f:
            contexts = json.load(f)
        env = envs[not name.endswith(".notrim")]
        for i, context in enumerate(contexts):
            base = os.path.join(out_dir, "%s.%d" % (name, i))
            try:
                text = env.from_string(source).render(**context)
                with open(base + ".out", "wb") as f:
                    f.write(text.encode("utf-8"))
            except Exception as e:  # any failure is an expected-error result
                with open(base + ".err", "w", encoding="utf-8") as f:
                    f.write("%s: %s\n" % (type(e).__name__, e))


if __name__ == "__main__":
    main()
