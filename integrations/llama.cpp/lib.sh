# shellcheck shell=bash
# Functions of run.sh: models, one case in its arms, the single checks, the scheduler cases.
# Reads run.sh's globals: bin, out, common, status, summaries; fail() sets status.

# Models: llama.cpp's generator at the sizes the cases need, and its quantizer.
make_models() { # BIN DIR
  local bin=$1 dir=$2
  mkdir -p "$dir/big" "$dir/mid" "$dir/q4" "$dir/arch"
  "$bin/test-llama-archs" -a llama -s 42 -d 1.0 -o "$dir"
  # dense-big: 14 layers of 2048 x 5632, F32: 2.68 GiB of device weights, past lavapipe's 2 GiB
  # allocation limit (so more than one import); its MoE sibling stays small enough to run
  LLAMA_ARCHS_ONLY=dense LLAMA_ARCHS_N_EMBD=2048 LLAMA_ARCHS_N_HEAD=16 LLAMA_ARCHS_N_FF=5632 \
    LLAMA_ARCHS_N_LAYER=14 "$bin/test-llama-archs" -a llama -s 42 -d 1.0 -o "$dir/big"
  LLAMA_ARCHS_ONLY=moe LLAMA_ARCHS_N_EMBD=1024 LLAMA_ARCHS_N_HEAD=8 LLAMA_ARCHS_N_FF=2816 \
    LLAMA_ARCHS_N_LAYER=6 "$bin/test-llama-archs" -a llama -s 42 -d 1.0 -o "$dir/big"
  # dense-q4_k: Q4_K_M of a 1.05 GiB F32 model (rows of 1536 and 4096: whole Q4_K blocks); the
  # F32 model itself serves refused-all and stock, where a doubled load would show in the RSS
  LLAMA_ARCHS_ONLY=dense LLAMA_ARCHS_N_EMBD=1536 LLAMA_ARCHS_N_HEAD=12 LLAMA_ARCHS_N_FF=4096 \
    LLAMA_ARCHS_N_LAYER=10 "$bin/test-llama-archs" -a llama -s 42 -d 1.0 -o "$dir/mid"
  "$bin/llama-quantize" "$dir/mid/llama-dense.gguf" "$dir/q4/llama-dense-q4_k_m.gguf" Q4_K_M 2
  # Q4_0 experts on the CPU (152 MiB), the rest F32 on the device: Mesa 22.3's lavapipe crashes
  # (SIGSEGV in its own worker thread) on a MoE graph whose attention is quantized, with or
  # without libweightmap and under -lm none alike
  "$bin/llama-quantize" --tensor-type "attn_(q|k|v|output)=f32" --tensor-type "^output=f32" \
    "$dir/big/llama-moe.gguf" "$dir/q4/llama-moe-q4_0.gguf" Q4_0 2
  "$bin/test-llama-archs" -a qwen3moe -s 42 -d 1.0 -o "$dir/arch"
  "$bin/test-llama-archs" -a gemma3 -s 42 -d 1.0 -o "$dir/arch"
}

# field NAME of the weightmap log line in FILE (a number; nan without it); the copy arm's line
# (LLAMA_WEIGHTMAP_IMPORT=0) has only rss_anon_delta
wm_field() {
  local line value
  line=$(grep -m1 -E 'weightmap: (device|disabled)' "$2") || { echo nan; return; }
  case $1 in
    device) value=$(sed -nE 's/.*weightmap: device ([0-9.]+) MiB.*/\1/p' <<< "$line") ;;
    imported) value=$(sed -nE 's/.*imported ([0-9.]+) MiB.*/\1/p' <<< "$line") ;;
    imports) value=$(sed -nE 's/.* in ([0-9]+) imports.*/\1/p' <<< "$line") ;;
    rss) value=$(sed -nE 's/.*rss_anon_delta (-?[0-9.]+) MiB.*/\1/p' <<< "$line") ;;
  esac
  echo "${value:-nan}"
}
load_seconds() { sed -nE 's/.*load time = +([0-9.]+) ms.*/\1/p' "$1" | tail -n 1 | awk '{printf "%.3f", $1 / 1000}'; }
# "offloaded N/M layers to GPU": N (layers) or M (all)
layers() { sed -nE "s/.*offloaded ([0-9]+)\/([0-9]+) layers to GPU.*/\\$2/p" "$1" | tail -n 1; }
load_mode() { sed -nE 's/.*load_mode = ([a-z+]+).*/\1/p' "$1" | tail -n 1; }
peak_mib() { awk 'END {printf "%d", $1 / 1024}' "$1" 2> /dev/null; } # /usr/bin/time's %M (KiB), last line
same_tokens() { cmp -s "$1.out" "$2.out" && [[ -s $1.out ]]; }

# One llama-completion run: LOG (prefix) BINARY MODEL, then env assignments and flags after --.
generate() {
  local log=$1 exe=$2 model=$3; shift 3
  local envs=()
  while [[ $# -gt 0 && $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  if ! env "${envs[@]}" /usr/bin/time -f %M -o "$log.maxrss" "$exe" -m "$model" "${common[@]}" "$@" \
      > "$log.out" 2> "$log.err" < /dev/null; then
    fail "$(basename "$log") failed; see $log.err"
    tail -n 5 "$log.err" >&2
  fi
}

print_header() {
  printf '%-24s %-8s %9s %9s %7s %7s %8s %8s %8s\n' case arm device import imports layers rss_anon peak_MiB load_s
}
print_arm() { # CASE ARM LOG
  printf '%-24s %-8s %9s %9s %7s %7s %8s %8s %8s\n' "$1" "$2" "$(wm_field device "$3.err")" \
    "$(wm_field imported "$3.err")" "$(wm_field imports "$3.err")" "$(layers "$3.err" 1)/$(layers "$3.err" 2)" \
    "$(wm_field rss "$3.err")" "$(peak_mib "$3.maxrss")" "$(load_seconds "$3.err")"
}

# A case in its arms, its summary line and its checks.
run_case() { # NAME MODEL EXTRA KIND
  local name=$1 model=$2 kind=$4
  local -a extra
  read -r -a extra <<< "$3"
  local i=$out/run/$name.import k=$out/run/$name.copy ref
  # lavapipe compiles each new kernel once into the shader cache: not into either arm's load time
  generate "$out/run/$name.warm-up" "$bin/llama-completion" "$model" -- -n 1 "${extra[@]}"
  case $kind in
    import)
      generate "$i" "$bin/llama-completion" "$model" -- "${extra[@]}"
      generate "$k" "$bin/llama-completion" "$model" LLAMA_WEIGHTMAP_IMPORT=0 -- "${extra[@]}" ;;
    refused) # every import refused, against upstream's default on an iGPU: no mmap, a read
      generate "$i" "$bin/llama-completion" "$model" LLAMA_WEIGHTMAP_TEST_REFUSE_IMPORT=all -- "${extra[@]}"
      generate "$k" "$bin/llama-completion" "$model" LLAMA_WEIGHTMAP_IMPORT=0 -- -lm none "${extra[@]}" ;;
    stock) # the build without LLAMA_WEIGHTMAP against the build with it, importing nothing
      generate "$i" "$out/stock/llama-completion" "$model" LD_LIBRARY_PATH="$out/stock:$LD_LIBRARY_PATH" -- "${extra[@]}"
      generate "$k" "$bin/llama-completion" "$model" LLAMA_WEIGHTMAP_IMPORT=0 -- "${extra[@]}" ;;
  esac
  print_arm "$name" "$kind" "$i"
  print_arm "$name" copy "$k"
  ref=$k
  local ngl_i ngl_k
  ngl_i=$(layers "$i.err" 1) ngl_k=$(layers "$k.err" 1)
  if [[ $kind == import && -n $ngl_i && $ngl_i != "$ngl_k" ]]; then
    # -fit gave the copy arm fewer layers: its tokens are compared at the import arm's -ngl
    ref=$out/run/$name.copy-ngl
    generate "$ref" "$bin/llama-completion" "$model" LLAMA_WEIGHTMAP_IMPORT=0 -- -ngl "$ngl_i" -fit off "${extra[@]}"
    print_arm "$name" copy-ngl "$ref"
  fi
  summarize_case "$name" "$kind" "$i" "$k" "$ref"
}

summarize_case() { # NAME KIND IMPORT_LOG COPY_LOG REFERENCE_LOG
  local name=$1 kind=$2 i=$3 k=$4 ref=$5 same=no device fraction peak_i peak_k
  same_tokens "$i" "$ref" && same=yes
  device=$(wm_field device "$i.err")
  fraction=$(awk -v a="$(wm_field imported "$i.err")" -v d="$device" 'BEGIN { printf "%.4f", (d > 0 ? a / d : 0) }')
  peak_i=$(peak_mib "$i.maxrss") peak_k=$(peak_mib "$k.maxrss")
  summaries+=("llama.cpp case=$name tokens_identical=$same device_mib=$device imported_fraction=$fraction imports=$(wm_field imports "$i.err") layers_on_device_import=$(layers "$i.err" 1) layers_on_device_copy=$(layers "$k.err" 1) n_layers=$(layers "$i.err" 2) import_rss_anon_delta_mib=$(wm_field rss "$i.err") copy_rss_anon_delta_mib=$(wm_field rss "$k.err") peak_rss_mib_import=$peak_i peak_rss_mib_copy=$peak_k load_s_import=$(load_seconds "$i.err") load_s_copy=$(load_seconds "$k.err")")
  [[ $same == yes ]] || fail "$name: the arms generated different tokens"
  case $kind in
    import)
      awk -v f="$fraction" 'BEGIN { exit !(f >= 0.99) }' || fail "$name: the import arm copies more than 1 % of the device bytes"
      if [[ $name == dense-big && $(layers "$i.err" 1) != "$(layers "$i.err" 2)" ]]; then
        fail "$name: -fit offloaded $(layers "$i.err" 1) of $(layers "$i.err" 2) layers in the import arm (imported weights cost no device memory)"
      fi ;;
    refused|stock)
      awk -v a="$peak_i" -v b="$peak_k" 'BEGIN { exit !(a > 0 && b > 0 && a <= 1.05 * b) }' ||
        fail "$name: peak RSS $peak_i MiB is more than 5 % above upstream's $peak_k MiB" ;;&
    refused)
      grep -q 'falling back to a device copy' "$i.err" || fail "$name: no refusal was logged" ;;
    stock)
      ! grep -q weightmap "$i.err" || fail "$name: the stock build logs weightmap lines"
      [[ $(load_mode "$i.err") == "$(load_mode "$k.err")" ]] ||
        fail "$name: load mode $(load_mode "$i.err") in the stock build, $(load_mode "$k.err") with LLAMA_WEIGHTMAP" ;;
  esac
}

# One refused import falls back alone: the big model's other imports stay.
check_refused_run_alone() { # MODEL
  local log=$out/run/refused-second
  generate "$log" "$bin/llama-completion" "$1" LLAMA_WEIGHTMAP_TEST_REFUSE_IMPORT=2 --
  local imports imported device
  imports=$(wm_field imports "$log.err") imported=$(wm_field imported "$log.err") device=$(wm_field device "$log.err")
  echo "refused 2nd import: $(grep -m1 'falling back to a device copy' "$log.err" | sed 's/.*llama_weightmap: //')"
  echo "  then: $(grep -m1 'weightmap: device' "$log.err" | sed 's/.*weightmap: //')"
  awk -v n="$imports" -v a="$imported" -v d="$device" 'BEGIN { exit !(n >= 1 && a > 0 && a < d) }' ||
    fail "a refused import did not fall back alone (imports $imports, imported $imported of $device MiB)"
  same_tokens "$log" "$out/run/dense-big.import" || fail "the refused-second run generated other tokens"
}

# Runs a corrupt MODEL in ARM (import or copy) with FLAGS, writing LOG.out/.err; prints the exit
# status, which must be an error (non-zero), never a signal.
run_corrupt() { # LOG MODEL ARM FLAGS...
  local log=$1 model=$2 arm=$3 rc=0 envs=(LLAMA_WEIGHTMAP_IMPORT=1); shift 3
  [[ $arm == copy ]] && envs=(LLAMA_WEIGHTMAP_IMPORT=0)
  env "${envs[@]}" "$bin/llama-completion" -m "$model" "${common[@]}" "$@" \
    > "$log.out" 2> "$log.err" < /dev/null || rc=$?
  echo "$rc"
}

# --check-tensors validates imported tensors too: a NaN written into a device tensor fails the
# load in both arms.
check_tensors_validated() { # MODEL
  local bad=$out/models/nan.gguf arm rc
  cp "$1" "$bad"
  # the middle of the file lies inside a layer's F32 weights (device tensors at the default -ngl)
  printf '\xff\xff\xff\x7f%.0s' $(seq 64) | dd of="$bad" bs=1 seek=$(($(stat -c %s "$bad") / 2 / 4 * 4)) conv=notrunc status=none
  for arm in import copy; do
    rc=$(run_corrupt "$out/run/nan.$arm" "$bad" "$arm" --check-tensors)
    echo "--check-tensors, NaN in a device tensor ($arm arm): exit $rc, $(grep -m1 'invalid data' "$out/run/nan.$arm.err" || echo 'not found')"
    ((rc != 0 && rc < 128)) && grep -q 'invalid data' "$out/run/nan.$arm.err" ||
      fail "--check-tensors did not reject the corrupt tensor in the $arm arm"
  done
}

# A truncated model fails cleanly in both arms (an error, never a signal).
check_truncated_model() { # MODEL
  local bad=$out/models/truncated.gguf arm rc
  head -c 100000 "$1" > "$bad"
  for arm in import copy; do
    rc=$(run_corrupt "$out/run/truncated.$arm" "$bad" "$arm")
    ((rc != 0 && rc < 128)) || fail "a truncated model ended with status $rc in the $arm arm (expected an error)"
    echo "corrupt model ($arm arm): exit $rc, $(grep -m1 -iE 'error|failed' "$out/run/truncated.$arm.err" || echo 'no message')"
  done
}

# The scheduler's split ordering: helper vs upstream, traced and replayed.
run_split_sync() { # MODELS_DIR
  local replay_bin=$libwm_build/bench/bench_split_sync c name model rule log stats replayed same splits
  local -a extra
  field() { sed -nE "s/.*[ ]$1=([0-9]+).*/\1/p" <<< "$2"; }
  printf '\n%-20s %-9s %7s %7s %6s %6s %15s %15s\n' case rule graphs splits syncs drains replay_hazards replay_syncs
  for c in "dense-partial|$1/llama-dense.gguf|-ngl 1" "moe-experts-on-cpu|$1/llama-moe.gguf|-ot exps=CPU"; do
    IFS='|' read -r name model rest <<< "$c"
    read -r -a extra <<< "$rest"
    declare -A syncs=() hazards=()
    for rule in helper upstream; do
      log=$out/run/split-$name.$rule
      rm -f "$log.trace"
      generate "$log" "$bin/llama-completion" "$model" GGML_WEIGHTMAP_SPLIT_SYNC=$rule \
        GGML_WEIGHTMAP_SPLIT_SYNC_STATS=1 GGML_WEIGHTMAP_SPLIT_SYNC_TRACE="$log.trace" -- -fit off "${extra[@]}"
      stats=$(grep -m1 '^split_sync: rule=' "$log.err" || true)
      "$replay_bin" --replay "$log.trace" > "$log.replay" 2>&1 || true
      replayed=$(grep "^replay rule=$rule " "$log.replay" || true)
      syncs[$rule]=$(field "syncs_$rule" "$stats")
      hazards[$rule]=$(field hazards "$replayed")
      printf '%-20s %-9s %7s %7s %6s %6s %15s %15s\n' "$name" "$rule" "$(field graphs "$stats")" \
        "$(field splits "$stats")" "${syncs[$rule]:-?}" "$(field drains "$stats")" "${hazards[$rule]:-?}" \
        "$(field syncs "$replayed")"
    done
    same=no
    same_tokens "$out/run/split-$name.helper" "$out/run/split-$name.upstream" && same=yes
    splits=$(field splits "$(grep -m1 '^split_sync: rule=' "$out/run/split-$name.helper.err" || true)")
    summaries+=("split_sync case=$name splits=${splits:-?} syncs_upstream=${syncs[upstream]:-?} syncs_helper=${syncs[helper]:-?} tokens_identical=$same replay_hazards_upstream=${hazards[upstream]:-?} replay_hazards_helper=${hazards[helper]:-?}")
    [[ $same == yes ]] || fail "split-sync $name: the rules generated different tokens"
    [[ ${hazards[helper]:-x} == 0 ]] || fail "split-sync $name: the helper's replay shows hazards"
    [[ -n ${syncs[helper]:-} && -n ${syncs[upstream]:-} ]] && ((syncs[helper] <= syncs[upstream])) ||
      fail "split-sync $name: the helper synced more than upstream"
    unset syncs hazards
  done
}

# Runs MODEL (64 tokens) with ENV... and writes the permissions of its mappings of MODEL once it
# has loaded (from /proc/PID/maps), one per line, to LOG.perms.
mapping_perms_after_load() { # LOG MODEL ENV...
  local log=$1 model=$2 pid; shift 2
  env "$@" "$bin/llama-completion" -m "$model" "${common[@]}" -n 64 > "$log.out" 2> "$log.err" < /dev/null &
  pid=$!
  for _ in $(seq 300); do grep -q 'weightmap: device' "$log.err" && break; sleep 0.1; done
  { grep -F "$(realpath "$model")" "/proc/$pid/maps" || true; } | awk '{print $2}' > "$log.perms"
  wait "$pid" || fail "$(basename "$log") failed; see $log.err"
}

# A device whose imports need writable pages (test hook): the model is mapped MAP_SHARED
# read-write, never privately, and the file is unchanged; where its imports survive PROT_READ the
# mapping goes back to read-only after loading; on a read-only bind mount it stays read-only and
# every weight is copied, with the same tokens.
check_writable_mapping() { # MODEL
  local model=$1 log=$out/run/writable hash perms ro=$out/ro-mount
  hash=$(sha256sum < "$model")
  mapping_perms_after_load "$log" "$model" LLAMA_WEIGHTMAP_TEST_NEEDS_WRITABLE=1
  perms=$(cat "$log.perms")
  echo "writable mapping: $(grep -m1 'llama_weightmap: mapping' "$log.err" | sed 's/.*llama_weightmap: //')"
  echo "  after loading: $(sort <<< "$perms" | uniq -c | tr -s ' \n' ' ')"
  grep -qx 'rw-s' <<< "$perms" || fail "the model was not mapped shared and writable"
  ! grep -q 'p$' <<< "$perms" || fail "the model was mapped privately"
  mapping_perms_after_load "$log-reprotect" "$model" LLAMA_WEIGHTMAP_TEST_NEEDS_WRITABLE=reprotect
  perms=$(cat "$log-reprotect.perms")
  echo "  imports that survive PROT_READ: $(grep -m1 're-protected' "$log-reprotect.err" | sed 's/.*llama_weightmap: //'); after loading: $(sort <<< "$perms" | uniq -c | tr -s ' \n' ' ')"
  [[ -n $perms ]] && ! grep -qv 'r--s' <<< "$perms" || fail "the writable mapping was not re-protected read-only"
  [[ $(sha256sum < "$model") == "$hash" ]] || fail "the model file changed under a writable mapping"
  mkdir -p "$ro"
  unshare -m bash -c 'mount --bind "$1" "$2" && mount -o remount,bind,ro "$2" && shift 2 && exec "$@"' _ \
    "$(dirname "$model")" "$ro" env LLAMA_WEIGHTMAP_TEST_NEEDS_WRITABLE=1 "$bin/llama-completion" \
    -m "$ro/$(basename "$model")" "${common[@]}" > "$log-ro.out" 2> "$log-ro.err" < /dev/null ||
    fail "the read-only-mount run failed; see $log-ro.err"
  echo "read-only mount: $(grep -m1 'llama_weightmap: mapping' "$log-ro.err" | sed 's/.*llama_weightmap: //')"
  grep -q 'imported 0.00 MiB' "$log-ro.err" || fail "a read-only file was imported by a device that needs writable pages"
  same_tokens "$log-ro" "$out/run/dense.import" || fail "the read-only-mount run generated other tokens"
}

# -lm mmap+mlock locks imported tensors as upstream locks the mapped ones: VmLck after loading
# covers at least the imported bytes.
check_mlock_locks_imports() { # MODEL
  local log=$out/run/mlock pid locked_kib=0 imported
  "$bin/llama-completion" -m "$1" "${common[@]}" -n 64 -lm mmap+mlock > "$log.out" 2> "$log.err" < /dev/null &
  pid=$!
  for _ in $(seq 300); do grep -q 'weightmap: device' "$log.err" && break; sleep 0.1; done
  locked_kib=$(awk '/^VmLck:/ {print $2}' "/proc/$pid/status" 2> /dev/null || echo 0)
  wait "$pid" || fail "the mlock run failed; see $log.err"
  imported=$(wm_field imported "$log.err")
  echo "-lm mmap+mlock: VmLck $((locked_kib / 1024)) MiB after loading, imported $imported MiB"
  awk -v l="$locked_kib" -v i="$imported" 'BEGIN { exit !(i > 0 && l / 1024 >= i) }' ||
    fail "-lm mmap+mlock did not lock the imported tensors (VmLck ${locked_kib} KiB, imported $imported MiB)"
}

# A tensor whose offset in its import misses the buffer type's alignment falls back alone
# (lavapipe asks 16 bytes and GGUF aligns to 32, so the test hook raises it to 256): the other
# tensors stay imported, the tokens stay the same, and ggml-vulkan asserts nowhere.
check_tensor_alignment() { # MODEL REFERENCE_LOG
  local log=$out/run/tensor-alignment imported device
  generate "$log" "$bin/llama-completion" "$1" LLAMA_WEIGHTMAP_TEST_TENSOR_ALIGNMENT=256 --
  imported=$(wm_field imported "$log.err") device=$(wm_field device "$log.err")
  echo "tensor alignment 256: $(grep -m1 'weightmap: device' "$log.err" | sed 's/.*weightmap: //; s/; policy.*//')"
  awk -v a="$imported" -v d="$device" 'BEGIN { exit !(a > 0 && a < d) }' ||
    fail "tensors misaligned for the buffer type did not fall back alone (imported $imported of $device MiB)"
  same_tokens "$log" "$2" || fail "the tensor-alignment run generated other tokens"
}
