#!/usr/bin/env bash
# The folders are layers (docs/ARCHITECTURE.md): a file may include headers of its own folder and
# of the folders below it, never of one above or beside it. Lists every include that breaks the
# order and exits 1 if there is one. Usage: scripts/check-layers.sh [source root]
set -uo pipefail
root=$(cd "${1:-$(dirname "$0")/..}" && pwd)
# The folders each folder may include from (besides itself), lowest layer first.
declare -A allowed=(
    [include]=""
    [core]="include"
    [backend]="include core"
    [templates]="include core"
    [cache]="include core"
    [plan]="include core backend templates"
    [autotune]="include core backend templates cache plan"
    [runtime]="include core backend templates cache plan autotune"
    [tools]="include core backend templates cache plan autotune runtime"
    [fuzz]="include core backend templates cache plan autotune runtime"
)
bad=0
checked=0
for folder in "${!allowed[@]}"; do
    [ -d "$root/$folder" ] || continue
    while IFS= read -r file; do
        dir=$(dirname "$file")
        while IFS= read -r inc; do
            checked=$((checked + 1))
            # Resolve against the including file's folder, then the public include folder.
            if [ -e "$dir/$inc" ]; then
                target=$(realpath -m "$dir/$inc")
            elif [ -e "$root/include/$inc" ]; then
                target="$root/include/$inc"
            else
                continue # generated (templates_embedded.c) or a system header in quotes
            fi
            rel=${target#"$root"/}
            top=${rel%%/*}
            [ "$top" = "$folder" ] && continue
            case " ${allowed[$folder]} " in
            *" $top "*) ;;
            *)
                echo "${file#"$root"/}: includes $rel ($folder may include from: ${allowed[$folder]:-nothing})"
                bad=1
                ;;
            esac
        done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$file")
    done < <(find "$root/$folder" -name '*.[ch]' -type f)
done
[ $bad -eq 0 ] && echo "layers: $checked includes in order"
exit $bad
