# shellcheck shell=bash
# Reads image/inputs.env without executing it: only the known keys, each KEY=value with a value
# of URL, version, package-list or integrity characters; anything else stops the build.
INPUT_KEYS=(DEBIAN_SUITE DEBIAN_MIRROR DEBIAN_SECURITY_MIRROR DEBIAN_SNAPSHOT DEBIAN_PACKAGES
  NODE_PACKAGE NODE_VERSION NODE_INTEGRITY BASE_EPOCH)

load_inputs() {
  local file=$1 line key
  for key in "${INPUT_KEYS[@]}"; do unset "$key"; done
  while IFS= read -r line || [ -n "$line" ]; do
    case $line in '' | '#'*) continue ;; esac
    [[ "$line" =~ ^([A-Z][A-Z0-9_]*)=([A-Za-z0-9@:/.,+=_~-]+)$ ]] || { echo "$file: not a KEY=value line: $line" >&2; return 1; }
    key=${BASH_REMATCH[1]}
    [[ " ${INPUT_KEYS[*]} " == *" $key "* ]] || { echo "$file: unknown key $key" >&2; return 1; }
    printf -v "$key" '%s' "${BASH_REMATCH[2]}"
  done < "$file"
  for key in "${INPUT_KEYS[@]}"; do
    [ -n "${!key:-}" ] || { echo "$file: $key is missing" >&2; return 1; }
  done
  [[ "$BASE_EPOCH" =~ ^[0-9]+$ ]] || { echo "$file: BASE_EPOCH must be seconds since 1970" >&2; return 1; }
  [[ "$NODE_INTEGRITY" =~ ^sha512-[A-Za-z0-9+/]{86}==$ ]] || { echo "$file: NODE_INTEGRITY must be a sha512 SRI string" >&2; return 1; }
}
