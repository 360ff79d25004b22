#!/usr/bin/env bash
# The repository stands alone: no tracked file reaches for data or docs beside the checkout, and every design
# document the code, tests, tools, benchmarks and README cite exists here, with the cited section.
# Usage: check_docs.sh <repository root>. Exits non-zero and lists every violation.
set -euo pipefail
cd "$1"
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || { echo "check_docs: $1 is not a git checkout"; exit 2; }

fail=0
report() {
  echo "$1"
  fail=1
}

# 1. Paths above the repository. bench/results/ holds raw logs of past runs and is exempt. The pattern is split
#    so that this file does not match itself.
above='\.\./shar''ed'
if hits=$(git grep -n -I -E "$above" -- . ':!bench/results'); then
  report "files that reach outside the repository:"$'\n'"$hits"
fi

# 2. Cited documents. A design document is cited by its path from the root (docs/<name>.md), in docs/ too.
#    Outside docs/, the older spellings without the docs/ prefix are reported so that they cannot come back.
#    Links between documents are relative (4.).
cite_dirs=(src tests tools bench scripts cmake README.md CMakeLists.txt Makefile)
existing=()
for d in "${cite_dirs[@]}"; do [[ -e $d ]] && existing+=("$d"); done
pathspec=("${existing[@]}" ':!bench/results')
with_docs=("${pathspec[@]}" docs)

while IFS= read -r hit; do
  file=${hit%%:*}
  path=${hit#*:}
  [[ -f $path ]] || report "$file: cites $path, which does not exist"
done < <(git grep -o -I -E 'docs/[A-Za-z0-9_./-]+\.md' -- "${with_docs[@]}" | sort -u)

bare='(^|[^A-Za-z0-9_./-])((spec/[a-z0-9_]+|DESIGN|STYLE|ARCHITECTURE|EXACTNESS|API|BENCHMARKS)\.md|(DESIGN|STYLE) (§|[0-9]))'
if hits=$(git grep -n -I -E "$bare" -- "${pathspec[@]}"); then
  report "citations without their docs/ path:"$'\n'"$hits"
fi

# 3. Cited sections. "docs/<name>.md §N[.M]" needs a heading "N." or "N.M" in that file; in code comments the short form
#    "spec §N" means docs/spec/qwen3_5_moe.md.
has_section() {  # file, section number: headings read "## 4. Title" and "### 4.1 Title"
  if [[ $2 == *.* ]]; then
    grep -q -E "^#+ ${2//./\\.} " "$1"
  else
    grep -q -E "^#+ $2\\. " "$1"
  fi
}
while IFS= read -r hit; do
  file=${hit%%:*}
  rest=${hit#*:}
  doc=${rest%% *}
  sec=${rest##*§}
  [[ $doc == spec ]] && doc=docs/spec/qwen3_5_moe.md
  [[ -f $doc ]] || continue  # reported above
  has_section "$doc" "$sec" || report "$file: cites $doc §$sec, which has no such section"
done < <(git grep -o -I -E '(docs/[A-Za-z0-9_./-]+\.md|(^|[^A-Za-z0-9_./-])spec) §[0-9]+(\.[0-9]+)?' -- "${with_docs[@]}" |
         sed -E 's/:[^A-Za-z0-9_]*(docs|spec)/:\1/' | sort -u)

# 4. Links between documents (relative to the linking file).
while IFS= read -r hit; do
  file=${hit%%:*}
  target=${hit#*](}
  target=${target%)}
  target=${target%%#*}
  [[ -z $target || $target == http* || $target == mailto:* ]] && continue
  [[ -e $(dirname "$file")/$target ]] || report "$file: links to $target, which does not exist"
done < <(git grep -o -I -E '\]\([^) ]+\)' -- '*.md' ':!bench/results')

if ((fail)); then
  exit 1
fi
echo "check_docs: no path outside the repository; every cited document, section and link exists"
