#!/bin/bash
# Runs inside the LVM test guest (scripts/vm/run-guest.sh): the sanity suite against the
# lvm backend. The host passes the test binary (FERROVOL_SANITY_BIN), the modules to run
# (FERROVOL_SANITY_ONLY, libtest filters, space separated), the tests inside them that
# only apply to the loop backend (FERROVOL_SANITY_SKIP) and extra libtest arguments
# (FERROVOL_SANITY_ARGS). The exit code is the suite's.
set -u
: "${FERROVOL_SANITY_BIN:?the host must name the sanity test binary}"
export FERROVOL_SANITY_BACKEND=lvm
skips=()
for name in ${FERROVOL_SANITY_SKIP:-}; do
  skips+=(--skip "$name")
done
# shellcheck disable=SC2086
"$FERROVOL_SANITY_BIN" ${FERROVOL_SANITY_ONLY:-} --include-ignored --skip lvm_guest:: "${skips[@]}" \
  --test-threads "${RUST_TEST_THREADS:-2}" ${FERROVOL_SANITY_ARGS:-} 2>&1 | tee /ctl/sanity.log
exit "${PIPESTATUS[0]}"
