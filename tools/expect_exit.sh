# Sourced by the command-line tests (*_flags_test.sh): `expect CODE TEXT ARGS...` runs "$bin" ARGS
# (within $expect_timeout seconds, default 60) and records a failure in $fail unless it exits with
# CODE and prints TEXT (a fixed string) on stdout or stderr. The test sets bin, then exits $fail.
fail=0
expect() {
  local code="$1" text="$2" out rc
  shift 2
  out="$(timeout "${expect_timeout:-60}" "$bin" "$@" 2>&1)"
  rc=$?
  if [ "$rc" != "$code" ] || ! grep -qF -- "$text" <<<"$out"; then
    echo "FAIL: $* exited $rc (expected $code), output should contain: $text"
    echo "$out"
    fail=1
  fi
}
