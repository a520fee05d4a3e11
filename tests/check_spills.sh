#!/usr/bin/env bash
# Fails if a hot loop of the SIMD kernels touches the stack with a vector register: a spill,
# which a micro-kernel sized for the wrong register file makes (24 accumulators on 16 ymm).
#   tests/check_spills.sh OBJECT...
# Reads, per SIMD target namespace (N_SSE4, N_AVX2, N_AVX3, N_AVX3_DL, N_NEON), the functions
# spill_probe_* (the micro-kernels; tests/spill_probe.cpp) and fma_loop (the FMA-peak
# yardstick, yardsticks/yardsticks.cpp) in the objects given, and counts the vector accesses to
# the stack inside their loops.
set -euo pipefail
objdump=${OBJDUMP:-objdump}
status=0 seen=0
for obj in "$@"; do
  report=$("$objdump" -d --no-show-raw-insn -C "$obj" | awk '
    # A vector register moved to or from the stack (x86: %rsp/%rbp; AArch64: [sp / [x29).
    function stack_vector(line) {
      return (line ~ /%[xyz]mm[0-9]+/ && line ~ /\(%(rsp|rbp)\)/) ||
             (line ~ /\[(sp|x29)/ && line ~ /[[:space:],]([qvdsz][0-9]+)([.,[:space:]]|$)/)
    }
    function hex(s,   v, i) {
      v = 0
      for (i = 1; i <= length(s); ++i) v = v * 16 + index("0123456789abcdef", substr(s, i, 1)) - 1
      return v
    }
    # Counts the stack accesses inside the function'"'"'s hot loops: the innermost loops (from the
    # target of a conditional backward branch to the branch, with no other such loop within)
    # that multiply (set-up, tail and reduction code may use the stack).
    function finish() {
      if (!keep) return
      n_loops = 0
      for (i = 1; i <= m; ++i) {
        if (insn[i] !~ /[[:space:]](j[a-z]+|b\.[a-z]+|cbn?z|tbn?z)[[:space:]]+[0-9a-f]+ </) continue
        if (insn[i] ~ /[[:space:]]jmp[[:space:]]/) continue
        target = insn[i]; sub(/^.*[[:space:]](j[a-z]+|b\.[a-z]+|cbn?z|tbn?z)[[:space:]]+/, "", target)
        sub(/ .*/, "", target)
        t = hex(target)
        if (t >= addr[i]) continue
        ++n_loops; loop_start[n_loops] = t; loop_end[n_loops] = addr[i]
      }
      count = 0
      for (l = 1; l <= n_loops; ++l) {
        inner = 1
        for (o = 1; o <= n_loops; ++o)
          if (o != l && loop_start[o] >= loop_start[l] && loop_end[o] <= loop_end[l] &&
              (loop_start[o] != loop_start[l] || loop_end[o] != loop_end[l])) inner = 0
        if (!inner) continue
        arithmetic = 0  # a loop of vector products (FMA; SSE4: multiply), not a tail or copy
        for (k = 1; k <= m; ++k)
          if (addr[k] >= loop_start[l] && addr[k] <= loop_end[l] && insn[k] ~ /fmadd[0-9]+ps|fmla[[:space:]]+[vz][0-9]|mulps/)
            arithmetic = 1
        if (!arithmetic) continue
        for (k = 1; k <= m; ++k)
          if (addr[k] >= loop_start[l] && addr[k] <= loop_end[l] && stack_vector(insn[k]) &&
              !(k in counted)) { counted[k] = 1; ++count }
      }
      print count, name
      delete counted
    }
    /^[0-9a-f]+ <.*>:$/ {
      finish()
      name = $0; sub(/^[0-9a-f]+ </, "", name); sub(/>:$/, "", name)
      keep = (name ~ /N_[A-Z0-9_]+::(spill_probe_[a-z_]+|fma_loop)\(/)
      m = 0
      next
    }
    keep && /^ +[0-9a-f]+:/ {
      ++m; insn[m] = $0
      a = $1; sub(/:$/, "", a); addr[m] = hex(a)
    }
    END { finish() }')
  [[ -z "$report" ]] && continue
  while read -r count name; do
    seen=$((seen + 1))
    if [[ $count -ne 0 ]]; then
      echo "SPILL: $name: $count vector accesses to the stack in its loops"
      status=1
    else
      echo "ok: $name"
    fi
  done <<< "$report"
done
if [[ $seen -eq 0 ]]; then
  echo "check_spills: no probe functions found in $*" >&2
  exit 1
fi
echo "$seen functions checked"
exit $status
