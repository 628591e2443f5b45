#!/bin/sh
# Regenerate webhook/node/layout.json from a HAMi-core checkout:
#   tools/region_layout.sh /path/to/HAMi-core
# The commit is read from the checkout and written into the table.
set -eu
hami=${1:?usage: tools/region_layout.sh HAMI_CORE_CHECKOUT}
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -std=gnu11 -I "$here/region_stubs" -I "$hami/src" -o "$out/layout" "$here/region_layout.c"
commit=$(git -C "$hami" rev-parse HEAD)
"$out/layout" | python3 -c '
import json, sys
table = json.load(sys.stdin)
table = {"hami_core_commit": sys.argv[1], "source": "src/multiprocess/multiprocess_memory_limit.h", **table}
json.dump(table, sys.stdout, indent=2)
print()
' "$commit" > "$here/../webhook/node/layout.json"
echo "wrote webhook/node/layout.json from HAMi-core $commit"
