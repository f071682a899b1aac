#!/bin/sh
# Writes the man page mha(1) to stdout from the CLI's own help text: the
# output of `mha --help` and of `mha <command> --help` for every command that
# `mha --help` lists, so the page and --help never disagree.
#   sh scripts/manpage.sh build/mha VERSION >mha.1
set -eu
mha=$1 version=$2

# roff-escape verbatim text: backslashes, and a leading . or ' (a request)
verbatim() {
  printf '.nf\n'
  sed -e 's/\\/\\e/g' -e "s/^\\([.']\\)/\\\\\\&\\1/"
  printf '.fi\n'
}

help=$("$mha" --help)
commands=$(printf '%s\n' "$help" | awk '/^commands:/ {on = 1; next} on && /^  [a-z]/ {print $1} on && /^$/ {on = 0}')
[ -n "$commands" ] || { echo "manpage.sh: '$mha --help' lists no commands" >&2; exit 1; }
# The one-line description: the line after the usage line, without "mha ".
summary=$(printf '%s\n' "$help" | sed -n '3s/^mha //p' | sed 's/\.$//')

printf '.TH MHA 1 "" "mha %s" "User Commands"\n' "$version"
printf '.SH NAME\nmha \\- %s\n' "$summary"
printf '.SH SYNOPSIS\n.B mha\n.I command\n[flags]\n'
printf '.SH DESCRIPTION\n'
printf '%s\n' "$help" | verbatim
printf '.SH COMMANDS\n'
for c in $commands; do
  printf '.SS mha %s\n' "$c"
  "$mha" "$c" --help | verbatim
done
printf '.SH SEE ALSO\nThe C API: include/mha.h (installed as <prefix>/include/mha.h); pkg-config mha.\n'
