#!/usr/bin/env bash
# What launch/gpu.sh and launch/tpu.sh share: their usage text (lines 2-14 of the script that was
# run), and a command printed the way a shell reads it back (--dry-run). Sourced, not run.

# The usage on stderr with `error: ...` when given a message; exit 2.
usage() {
  sed -n '2,14p' "${BASH_SOURCE[-1]}" | sed 's/^# \{0,1\}//' >&2
  if [[ $# -gt 0 ]]; then
    echo "error: $*" >&2
  fi
  exit 2
}

# --help: the usage on stdout, exit 0.
show_help() {
  sed -n '2,14p' "${BASH_SOURCE[-1]}" | sed 's/^# \{0,1\}//'
  exit 0
}

# Prints a command the way a shell would read it back: words that need it in single quotes.
quote() {
  local out=() word
  for word in "$@"; do
    if [[ "$word" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
      out+=("$word")
    else
      out+=("'${word//\'/\'\\\'\'}'")
    fi
  done
  printf '%s\n' "${out[*]}"
}
