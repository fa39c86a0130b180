#!/usr/bin/env bash
# lint_doc_links: fails when a file of the repository points readers to a document that is not
# in it. The repository explains itself (docs/architecture.md, docs/development.md); notes that
# developers keep beside the checkout are not part of it, so a comment or a doc citing them
# leaves a newcomer with a dead reference.
#
# Forbidden anywhere in a tracked (or new, not ignored) text file:
#   - the names of the developers' design, style and build notes;
#   - a path into the shared folder beside the checkout that ends in .md, except under its
#     models/ and traces/ folders: those are test data (a model card is part of its model), which
#     tests, docs and commands legitimately use through PD_SHARED_DIR or ../shared/...;
#   - an absolute path to that folder on a developer machine.
# The patterns below are spelled with bracket expressions so that this file does not match them.
#
# usage: doc_links_test.sh --source-dir DIR
# First checks itself on a generated tree (each kind of bad reference must be reported, data
# paths must not), then scans DIR. Exit 0 = clean, 1 = offending lines (printed), 2 = usage.
set -euo pipefail

src=""
while [ $# -gt 0 ]; do
  case "$1" in
    --source-dir) src="$2"; shift 2 ;;
    --source-dir=*) src="${1#*=}"; shift ;;
    *) echo "doc_links_test: unknown argument: $1" >&2; exit 2 ;;
  esac
done
if [ -z "$src" ] || [ ! -d "$src" ]; then
  echo "doc_links_test: --source-dir must name the source tree (got '${src}')" >&2
  exit 2
fi

# Whole-line patterns: a match anywhere is an offence.
names_re='DESIGN[.]md|STYLE[.]md|BUILD[-]NOTES|STYLE[ ]§|/work[/]shared'
# A path into ../shared ending in .md; allowed only under models/ and traces/.
shared_md_re='[.][.]/shared/[^[:space:]`"'"'"'()<>]*[.]md'
shared_data_re='^[.][.]/shared/(models|traces)/'

# Prints the files to scan under $1, NUL-separated: git's view of the tree when it is a
# checkout (tracked files plus new ones not ignored), otherwise every file outside build trees,
# node_modules and .git.
list_files() {
  local dir="$1"
  if git -C "$dir" rev-parse --is-inside-work-tree >/dev/null 2>&1 &&
     [ "$(git -C "$dir" rev-parse --show-toplevel)" = "$(cd "$dir" && pwd -P)" ]; then
    (cd "$dir" && git ls-files -z --cached --others --exclude-standard)
  else
    (cd "$dir" && find . -type d \( -name .git -o -name node_modules -o -name 'build*' \) -prune \
       -o -type f -print0 | sed -z 's|^\./||')
  fi
}

# Prints "file:line: text" for every offending line under $1 (-s: a file git lists but the work
# tree has deleted is skipped silently).
scan() {
  local dir="$1" list
  list="$(mktemp)"
  (cd "$dir" && list_files .) > "$list"
  (
    cd "$dir"
    xargs -0 -r grep -sInE -- "$names_re" < "$list" || true
    xargs -0 -r grep -sInoE -- "$shared_md_re" < "$list" |
      awk -v data="$shared_data_re" '{ m = $0; sub(/^[^:]*:[0-9]+:/, "", m); if (m !~ data) print }' ||
      true
  )
  rm -f "$list"
}

# ---- self-check on a generated tree --------------------------------------------------------------
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/tree/docs" "$tmp/tree/src" "$tmp/tree/build/x"
d='DESIGN'; s='STYLE'; b='BUILD'; sh='../shared'
printf '%s\n' "// KvLayout: one block (${d}.md \"KV layout\")." > "$tmp/tree/src/bad_design.h"
printf '%s\n' "The rules are in \`${sh}/${s}.md\`." > "$tmp/tree/docs/bad_style.md"
printf '%s\n' "# median 16.9 GB/s; ${b}-NOTES says ~32 GB/s" > "$tmp/tree/src/bad_notes.txt"
printf '%s\n' "// ${s} §10 allows flags only in main.cc" > "$tmp/tree/src/bad_section.cc"
printf '%s\n' "To measure: (${sh}/gpu/README.md)." > "$tmp/tree/docs/bad_gpu.md"
w='/work'
printf '%s\n' "see ${w}/shared/x" > "$tmp/tree/docs/bad_abs.md"
{
  printf '%s\n' "build/engine/tools/pd-generate --model=${sh}/models/stories260K/stories260K.bin"
  printf '%s\n' "The model card (\`${sh}/models/stories260K/README.md\`) gives the greedy text."
  printf '%s\n' "pd-routesim --trace=${sh}/traces/mooncake_conversation_trace.jsonl"
  printf '%s\n' "// Design notes live in docs/architecture.md, \"KV layout\"."
} > "$tmp/tree/docs/good.md"
printf '%s\n' "(${d}.md)" > "$tmp/tree/build/x/ignored_build_output.h"
found="$(scan "$tmp/tree" | cut -d: -f1 | sort -u | tr '\n' ' ')"
want="docs/bad_abs.md docs/bad_gpu.md docs/bad_style.md src/bad_design.h src/bad_notes.txt src/bad_section.cc "
if [ "$found" != "$want" ]; then
  echo "doc_links_test: self-check failed: reported [$found], expected [$want]" >&2
  scan "$tmp/tree" >&2
  exit 1
fi

# ---- the real tree -------------------------------------------------------------------------------
bad="$(scan "$src")"
if [ -n "$bad" ]; then
  echo "Files point to documents outside the repository (the developers' notes beside the checkout):"
  echo "$bad"
  echo "Cite the docs/ page and section that holds the information instead, e.g."
  echo "  // ... (docs/architecture.md, \"KV layout\")   or   docs/development.md, \"Errors\"."
  exit 1
fi
echo "doc_links_test: no references to documents outside the repository"
