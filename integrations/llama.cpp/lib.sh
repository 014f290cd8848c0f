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
  # dense-shards: the small dense model as llama-gguf-split shards of at most 2 MiB
  mkdir -p "$dir/shards"
  "$bin/llama-gguf-split" --split --split-max-size 2M "$dir/llama-dense.gguf" "$dir/shards/llama-dense"
  "$bin/test-llama-archs" -a qwen3moe -s 42 -d 1.0 -o "$dir/arch"
  "$bin/test-llama-archs" -a gemma3 -s 42 -d 1.0 -o "$dir/arch"
  # qwen35: Gated DeltaNet layers, whose recurrent state -nkvo keeps on the CPU (the scheduler case)
  "$bin/test-llama-archs" -a '^qwen35$' -s 42 -d 1.0 -o "$dir/arch"
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
# Seconds from the start of the process to its last llama_context (fit, every load attempt, the weights)
ready_seconds() { grep 'llama_context: constructing llama_context' "$1" | tail -n 1 | awk '{ split($1, t, "."); printf "%.2f", t[1] * 60 + t[2] + t[3] / 1e3 }'; }
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

# the loader's buffer lines of LOG, without timestamps
buffer_lines() { grep 'model buffer size' "$1" | sed -E 's/^[0-9.]+ [A-Z] //'; }

# No ggml library of the builds in DIRS lists libweightmap as NEEDED, the stock libllama (the
# first dir) neither, and every other libllama reaches libweightmap through its C API alone (no
# C++ wm:: symbol crosses the boundary). Prints one line per finding; fails on any.
check_boundaries() { # STOCK_DIR DIR...
  local dir lib n bad=0
  for dir in "$@"; do
    for lib in "$dir"/libggml*.so; do
      if readelf -d "$lib" | grep NEEDED | grep -q libweightmap; then
        echo "run.sh: $lib lists libweightmap as NEEDED" >&2; bad=1
      fi
    done
  done
  if readelf -d "$1/libllama.so" | grep NEEDED | grep -q libweightmap; then
    echo "run.sh: the stock $1/libllama.so lists libweightmap as NEEDED" >&2; bad=1
  fi
  for dir in "${@:2}"; do
    n=$(nm -D --undefined-only "$dir/libllama.so" | c++filt | grep -c 'wm::' || true)
    if ((n > 0)); then echo "run.sh: $dir/libllama.so imports $n C++ wm:: symbols" >&2; bad=1; fi
  done
  return $bad
}

# check_boundaries must fail for the reasons it names: a ggml library that links libweightmap
# and a libllama that calls its C++ API, built here in a scratch folder.
check_boundaries_control() {
  local dir=$out/boundaries-control
  rm -rf "$dir" && mkdir -p "$dir" && cp "$out/stock/libllama.so" "$dir/" || return 1
  printf '#include <weightmap/split_sync.hpp>\nvoid control() { (void) wm::SplitSync::create({2, false}); }\n' > "$dir/control.cpp"
  # shellcheck disable=SC2046
  g++ -std=c++17 -shared -fPIC $(pkg-config --cflags weightmap) "$dir/control.cpp" -o "$dir/libggml-control.so" \
    $(pkg-config --libs weightmap) && cp "$dir/libggml-control.so" "$dir/libllama.so" || return 1
  if check_boundaries "$out/stock" "$dir" 2> "$dir/findings"; then
    fail "check_boundaries passed a ggml library linking libweightmap and a libllama using wm::"
  fi
  echo "boundaries control: $(grep -c . "$dir/findings") findings on a library built to break them ($(grep -o 'lists libweightmap\|C++ wm:: symbols' "$dir/findings" | sort -u | tr '\n' ';'))"
}

# The series built without any option against a pristine upstream build, on MODEL with FLAGS:
# the same load-mode decision, the same buffer lines, the same tokens, peak RSS within 1 %. Three
# runs of each, alternated (stock upstream upstream stock stock upstream): the peaks compared are
# medians, since lavapipe's own allocations move a single run's peak by a few MiB and whichever
# build ran second came out higher.
run_stock_case() { # NAME MODEL FLAGS
  local name=$1 model=$2 s=$out/run/stock-$1 u=$out/run/upstream-$1 same=no mode=no bufs=no ps pu arm rep=0
  local -a extra
  read -r -a extra <<< "$3"
  generate "$s.warm-up" "$out/stock/llama-completion" "$model" LD_LIBRARY_PATH="$out/stock:$LD_LIBRARY_PATH" -- -n 1 "${extra[@]}"
  for arm in s u u s s u; do
    rep=$((rep + 1))
    if [[ $arm == s ]]; then
      generate "$s.$rep" "$out/stock/llama-completion" "$model" LD_LIBRARY_PATH="$out/stock:$LD_LIBRARY_PATH" -- "${extra[@]}"
    else
      generate "$u.$rep" "$upstream_bin/llama-completion" "$model" LD_LIBRARY_PATH="$upstream_bin:$LD_LIBRARY_PATH" -- "${extra[@]}"
    fi
  done
  same_tokens "$s.1" "$u.2" && same_tokens "$s.1" "$s.5" && same=yes
  [[ -n $(load_mode "$s.1.err") && $(load_mode "$s.1.err") == "$(load_mode "$u.2.err")" ]] && mode=yes
  [[ -n $(buffer_lines "$s.1.err") && $(buffer_lines "$s.1.err") == "$(buffer_lines "$u.2.err")" ]] && bufs=yes
  ps=$(median_peak "$s".{1,4,5}.maxrss) pu=$(median_peak "$u".{2,3,6}.maxrss)
  summaries+=("llama.cpp stock case=$name tokens_identical=$same same_load_mode=$mode same_buffers=$bufs peak_rss_mib_stock=$ps peak_rss_mib_upstream=$pu load_s_stock=$(load_seconds "$s.1.err") load_s_upstream=$(load_seconds "$u.2.err")")
  [[ $same == yes && $mode == yes && $bufs == yes ]] || fail "stock $name: differs from upstream (tokens $same, load mode $mode, buffers $bufs)"
  ! grep -q weightmap "$s.1.err" || fail "stock $name: the stock build logs weightmap lines"
  awk -v a="$ps" -v b="$pu" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && b > 0 && d <= 0.01 * b) }' ||
    fail "stock $name: median peak RSS $ps MiB, upstream $pu MiB: more than 1 % apart"
}

# The median of three runs' peak RSS in MiB.
median_peak() { for f in "$@"; do peak_mib "$f"; echo; done | sort -n | sed -n 2p; }

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
    import|two-devices)
      generate "$i" "$bin/llama-completion" "$model" -- "${extra[@]}"
      generate "$k" "$bin/llama-completion" "$model" LLAMA_WEIGHTMAP_IMPORT=0 -- "${extra[@]}" ;;
    fit-refused) # every import refused in the real load, after the memory fit counted it as host
      # memory (the test build's hook), against a pristine upstream build's -fit, same flags
      generate "$i" "$out/testing/llama-completion" "$model" LD_LIBRARY_PATH="$out/testing:$LD_LIBRARY_PATH" \
        LLAMA_WEIGHTMAP_TEST_REFUSE_IMPORT=after-fit -- "${extra[@]}"
      generate "$k" "$upstream_bin/llama-completion" "$model" LD_LIBRARY_PATH="$upstream_bin:$LD_LIBRARY_PATH" -- "${extra[@]}" ;;
    refused) # every import refused (the test build's hook), against a pristine upstream build's
      # default on this device, same flags
      generate "$i" "$out/testing/llama-completion" "$model" LD_LIBRARY_PATH="$out/testing:$LD_LIBRARY_PATH" \
        LLAMA_WEIGHTMAP_TEST_REFUSE_IMPORT=all -- "${extra[@]}"
      generate "$k" "$upstream_bin/llama-completion" "$model" LD_LIBRARY_PATH="$upstream_bin:$LD_LIBRARY_PATH" -- "${extra[@]}" ;;
    refused-real) # the driver's own refusal: ggml-vulkan's buffer limit (its GGML_VK_FORCE_MAX_BUFFER_SIZE)
      # below the import, above its allocation blocks, so buffer_from_host_ptr returns NULL
      generate "$i" "$bin/llama-completion" "$model" GGML_VK_FORCE_MAX_BUFFER_SIZE=2097152 \
        GGML_VK_SUBALLOCATION_BLOCK_SIZE=1048576 -- "${extra[@]}"
      generate "$k" "$bin/llama-completion" "$model" LLAMA_WEIGHTMAP_IMPORT=0 -- "${extra[@]}" ;;
    igpu) # AUTO on a device typed iGPU (the test build's GGML_VK_TEST_REPORT_IGPU=1): upstream turns
      # mmap off there; the copy arm is the same build importing nothing (stock is upstream)
      generate "$i" "$out/testing/llama-completion" "$model" LD_LIBRARY_PATH="$out/testing:$LD_LIBRARY_PATH" \
        GGML_VK_TEST_REPORT_IGPU=1 -- "${extra[@]}"
      generate "$k" "$out/testing/llama-completion" "$model" LD_LIBRARY_PATH="$out/testing:$LD_LIBRARY_PATH" \
        GGML_VK_TEST_REPORT_IGPU=1 LLAMA_WEIGHTMAP_IMPORT=0 -- "${extra[@]}" ;;
    aside) # --no-mmap or direct I/O: no import, loaded exactly as upstream loads it
      generate "$i" "$bin/llama-completion" "$model" -- "${extra[@]}"
      generate "$k" "$upstream_bin/llama-completion" "$model" LD_LIBRARY_PATH="$upstream_bin:$LD_LIBRARY_PATH" -- "${extra[@]}" ;;
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
  # no device line (every import refused, or a refit that copied): 0
  fraction=$(awk -v a="$(wm_field imported "$i.err")" -v d="$device" 'BEGIN { printf "%.4f", (d + 0 > 0 ? a / d : 0) }')
  peak_i=$(peak_mib "$i.maxrss") peak_k=$(peak_mib "$k.maxrss")
  local check=pass
  case $kind in
    refused-real) grep -q 'buffer_from_host_ptr(.*) returned NULL' "$i.err" && awk -v f="$fraction" 'BEGIN { exit !(f < 0.99) }' || check=fail ;;
    igpu) # only the imports come from a mapping: the CPU's tensors are read into the same buffers
      [[ $(load_mode "$i.err") == none && $(load_mode "$k.err") == none &&
         $(buffer_lines "$i.err" | grep -v Vulkan0) == "$(buffer_lines "$k.err" | grep -v Vulkan0)" ]] &&
        ! grep -q 'mmap enabled' "$i.err" || check=fail ;;
    aside) grep -q 'weightmap: disabled' "$i.err" && [[ $(buffer_lines "$i.err") == "$(buffer_lines "$k.err")" &&
             $(load_mode "$i.err") == "$(load_mode "$k.err")" ]] || check=fail ;;
    fit-refused) # the load stopped at the refusal, fit again and loaded at least upstream's layers
      grep -q 'refused imports of .* that the memory fit counted' "$i.err" && grep -q 'fitting and loading again' "$i.err" &&
        (($(layers "$i.err" 1) >= $(layers "$k.err" 1))) &&
        awk -v a="$peak_i" -v b="$peak_k" 'BEGIN { exit !(a > 0 && b > 0 && a <= 1.05 * b) }' || check=fail ;;
    two-devices) # the RPC device's tensors load exactly as without imports
      [[ -n $(buffer_lines "$i.err" | grep RPC) && $(buffer_lines "$i.err" | grep -v Vulkan0) == "$(buffer_lines "$k.err" | grep -v Vulkan0)" ]] ||
        check=fail ;;
  esac
  summaries+=("llama.cpp case=$name tokens_identical=$same device_mib=$device imported_fraction=$fraction imports=$(wm_field imports "$i.err") layers_on_device_import=$(layers "$i.err" 1) layers_on_device_copy=$(layers "$k.err" 1) n_layers=$(layers "$i.err" 2) import_rss_anon_delta_mib=$(wm_field rss "$i.err") copy_rss_anon_delta_mib=$(wm_field rss "$k.err") peak_rss_mib_import=$peak_i peak_rss_mib_copy=$peak_k load_s_import=$(load_seconds "$i.err") load_s_copy=$(load_seconds "$k.err") ready_s_import=$(ready_seconds "$i.err") ready_s_copy=$(ready_seconds "$k.err") check=$check")
  [[ $same == yes ]] || fail "$name: the arms generated different tokens"
  case $kind in
    import|two-devices)
      awk -v f="$fraction" 'BEGIN { exit !(f >= 0.99) }' || fail "$name: the import arm copies more than 1 % of the device bytes"
      [[ $check == pass ]] || fail "$name: the second device's tensors did not load as without imports"
      if [[ $name == dense-big && $(layers "$i.err" 1) != "$(layers "$i.err" 2)" ]]; then
        fail "$name: -fit offloaded $(layers "$i.err" 1) of $(layers "$i.err" 2) layers in the import arm (imported weights cost no device memory)"
      fi ;;
    refused)
      awk -v a="$peak_i" -v b="$peak_k" 'BEGIN { exit !(a > 0 && b > 0 && a <= 1.05 * b) }' ||
        fail "$name: peak RSS $peak_i MiB is more than 5 % above upstream's $peak_k MiB"
      grep -q 'falling back to a device copy' "$i.err" || fail "$name: no refusal was logged" ;;
    refused-real)
      [[ $check == pass ]] || fail "$name: the driver's refusal was not logged, or the run still imported" ;;
    aside)
      [[ $check == pass ]] || fail "$name: the import did not step aside as upstream loads (buffers or load mode differ)" ;;
    fit-refused)
      [[ $check == pass ]] ||
        fail "$name: a refusal after -fit did not fit again, left fewer layers on the device than upstream, or peaked > 5 % above it" ;;
    igpu)
      [[ $check == pass ]] || fail "$name: on an iGPU the CPU's tensors did not load as upstream loads them (load mode, buffers or a mmap warning)"
      awk -v f="$fraction" 'BEGIN { exit !(f >= 0.99) }' || fail "$name: the iGPU imported < 99 % of its device bytes" ;;
  esac
}

# One refused import falls back alone: the big model's other imports stay. Without -fit: with it,
# a refusal at the real load (-fit's trials import nothing) takes the refit path, fit-refused's.
check_refused_run_alone() { # MODEL
  local log=$out/run/refused-second
  generate "$log" "$out/testing/llama-completion" "$1" LD_LIBRARY_PATH="$out/testing:$LD_LIBRARY_PATH" \
    LLAMA_WEIGHTMAP_TEST_REFUSE_IMPORT=2 -- -fit off
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

# True when the check program EXE must be built: missing, or older than its SOURCE, libllama or
# the installed libweightmap (a new soversion leaves an old binary unable to start).
stale() { # EXE SOURCE
  local dep
  [[ -x $1 ]] || return 0
  for dep in "$2" "$bin/libllama.so" "$(find "$dest" -name 'libweightmap.so.*' -print -quit)"; do
    [[ $dep -nt $1 ]] && return 0
  done
  return 1
}

# One check's summary line: NAME, pass or fail, then KEY=VALUE details.
check_line() { # NAME PASS DETAILS...
  local name=$1 pass=$2; shift 2
  summaries+=("llama.cpp case=$name kind=check $* check=$pass")
  [[ $pass == pass ]] || fail "$name: failed ($*)"
}

# --check-tensors validates imported tensors where they are mapped: a NaN written into the first
# tensor of the first import that IMPORT_LOG reports (F32 weights) fails the load in both arms,
# and the corrupt model's own import run reports that tensor imported again.
check_tensors_validated() { # MODEL IMPORT_LOG
  local bad=$out/models/nan.gguf arm rc line tensor offset pass=pass detail=""
  line=$(grep -m1 -E 'llama_weightmap: .*: import 0: .* tensors from ' "$2.err") ||
    { check_line check-tensors-nan-imported fail "no import reported in $2.err"; return; }
  tensor=$(sed -nE 's/.* tensors from ([^ ]+) at ([0-9]+)$/\1/p' <<< "$line")
  offset=$(sed -nE 's/.* tensors from ([^ ]+) at ([0-9]+)$/\2/p' <<< "$line")
  cp "$1" "$bad"
  printf '\xff\xff\xff\x7f%.0s' $(seq 64) | dd of="$bad" bs=1 seek="$offset" conv=notrunc status=none
  for arm in import copy; do
    rc=$(run_corrupt "$out/run/nan.$arm" "$bad" "$arm" --check-tensors)
    detail+=" exit_$arm=$rc"
    ((rc != 0 && rc < 128)) && grep -q "tensor '$tensor' has invalid data" "$out/run/nan.$arm.err" || pass=fail
  done
  grep -qE ": import 0: .* tensors from $tensor at $offset\$" "$out/run/nan.import.err" || pass=fail
  echo "--check-tensors, NaN in imported $tensor at $offset: $(grep -m1 'invalid data' "$out/run/nan.import.err" | sed -E 's/^[0-9.]+ [A-Z] //')"
  check_line check-tensors-nan-imported "$pass" "tensor=$tensor offset=$offset$detail"
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

# The file cut inside an imported extent after the plan was made (the test build's hook, on a
# copy): the load fails with an error naming the file, never a signal.
check_truncated_after_planning() { # MODEL
  local copy=$out/models/truncated-after-planning.gguf log=$out/run/truncated-after-planning rc=0 pass=pass
  cp "$1" "$copy"
  env LD_LIBRARY_PATH="$out/testing:$LD_LIBRARY_PATH" LLAMA_WEIGHTMAP_TEST_TRUNCATE_AFTER_PLANNING=1 \
    "$out/testing/llama-completion" -m "$copy" "${common[@]}" > "$log.out" 2> "$log.err" < /dev/null || rc=$?
  ((rc != 0 && rc < 128)) && grep -q "shrank from" "$log.err" || pass=fail
  echo "truncated after planning: exit $rc, $(grep -m1 'shrank from' "$log.err" | sed -E 's/^[0-9.]+ [A-Z] //' || echo 'no message')"
  check_line truncated-after-planning "$pass" "exit=$rc size_after=$(stat -c %s "$copy")"
  rm -f "$copy"
}

# Load, free, load in one process (reload_check.cpp against this libllama): no mapping of the
# model left after a free, RSS back.
check_reload() { # MODEL
  local exe=$out/reload_check log=$out/run/reload rc=0 pass=pass
  if stale "$exe" "$here/reload_check.cpp"; then
    g++ -std=c++17 -O2 -Wall -Wextra -Werror -I"$out/src/include" -I"$out/src/ggml/include" "$here/reload_check.cpp" \
      -o "$exe" -L"$bin" -lllama -lggml -lggml-base -Wl,-rpath,"$bin" || { check_line reload fail "does not build"; return; }
  fi
  "$exe" "$1" 3 > "$log.out" 2> "$log.err" || rc=$?
  cat "$log.out"
  [[ $rc == 0 && $(grep -c 'back=yes' "$log.out") == 3 && $(grep -c 'weightmap: device' "$log.err") == 3 ]] &&
    ! grep -q 'mappings_after_free=[1-9]' "$log.out" && ! grep -q 'imported 0.00 MiB' "$log.err" || pass=fail
  check_line reload "$pass" "loads=3 exit=$rc imports_per_load=$(grep -m1 -oE 'in [0-9]+ imports' "$log.err" | grep -oE '[0-9]+')"
}

# The correctness gate for in-place reads: the import arm's logits against the copy arm's on the
# same device, with llama-perplexity's KL divergence (the copy arm saves its logits with
# --kl-divergence-base, the import arm compares) at two ubatch sizes, as llama.cpp#28211 did to
# find gfx1151's wrong reads of mmap-loaded weights (llama.cpp#26543). Both arms run the same
# kernels on the same bytes, so the gate is tight: mean KLD <= 1e-6 and top token always the same.
# Its control must fail it: another model's import (the quantized one) against these logits.
# (The base file stores log-probabilities in 16 bits: identical logits give |KLD| up to ~5e-5 per
# token and a mean of 0.000000.)
kld_field() { # FIELD LOG: Mean or Maximum KLD, or Same top p (%)
  case $1 in
    mean) sed -nE 's/^Mean +KLD: +([0-9.e+-]+).*/\1/p' "$2" ;;
    max) sed -nE 's/^Maximum KLD: +([0-9.e+-]+).*/\1/p' "$2" ;;
    top) sed -nE 's/^Same top p: +([0-9.]+).*/\1/p' "$2" ;;
  esac | tail -n 1
}
perplexity_arm() { # LOG MODEL TEXT UBATCH BASE IMPORT(0|1) [--kl-divergence]
  local log=$1 model=$2 text=$3 ub=$4 base=$5 import=$6; shift 6
  env LLAMA_WEIGHTMAP_IMPORT="$import" "$bin/llama-perplexity" -m "$model" -f "$text" -c 128 -b 128 -ub "$ub" \
    --chunks 4 -t 2 -ngl 99 -v --kl-divergence-base "$base" "$@" > "$log.out" 2> "$log.err" < /dev/null
}
check_correctness() { # MODEL QUANTIZED_MODEL
  local text=$out/src/README.md ub name log base mean max top pass
  for ub in 128 32; do
    name=kld-ub$ub log=$out/run/$name base=$out/run/$name.base
    perplexity_arm "$log.copy" "$1" "$text" "$ub" "$base" 0 || fail "$name: the copy arm's llama-perplexity failed; see $log.copy.err"
    perplexity_arm "$log.import" "$1" "$text" "$ub" "$base" 1 --kl-divergence ||
      fail "$name: the import arm's llama-perplexity failed; see $log.import.err"
    mean=$(kld_field mean "$log.import.out") max=$(kld_field max "$log.import.out") top=$(kld_field top "$log.import.out")
    pass=no
    awk -v m="${mean:-1}" -v t="${top:-0}" 'BEGIN { exit !(m <= 1e-6 && t >= 100) }' && grep -q 'weightmap: device' "$log.import.err" && pass=yes
    summaries+=("llama.cpp correctness case=$name model=$(basename "$1") kld_mean=${mean:-nan} kld_max=${max:-nan} same_top_p=${top:-nan} pass=$pass")
    [[ $pass == yes ]] || fail "$name: the import arm's logits differ from the copy arm's (mean KLD ${mean:-?}, same top ${top:-?} %)"
  done
  # the control: logits that really differ (another model's, same vocabulary) fail the same test
  log=$out/run/kld-control
  perplexity_arm "$log" "$2" "$text" 128 "$out/run/kld-ub128.base" 1 --kl-divergence || true
  mean=$(kld_field mean "$log.out")
  if awk -v m="${mean:-0}" 'BEGIN { exit !(m <= 1e-6) }'; then
    fail "the correctness gate passed logits that differ (another model's: mean KLD ${mean:-?}); see $log.out"
  fi
  echo "correctness gate control: another model against these logits, mean KLD ${mean:-?} (must fail the gate)"
}

# -fit's trials import nothing: over a whole -fit load (its trials and the real load) the process
# imports at most the bytes the real load planned (the test build's log line). A trial that
# imported would pin the whole model once per trial on HSA and on Orin. On lavapipe: the llama
# loads with ggml-cuda and ggml-hip cannot run here, and the counter is the glue's, whichever
# importer is under it.
check_fit_pins_once() { # MODEL
  local log=$out/run/fit-pins line planned total trials
  generate "$log" "$out/testing/llama-completion" "$1" LD_LIBRARY_PATH="$out/testing:$LD_LIBRARY_PATH" -- -n 2
  line=$(grep 'llama_weightmap: test: .* planned ' "$log.err" | tail -n 1)
  planned=$(sed -nE 's/.* planned ([0-9.]+) MiB of imports.*/\1/p' <<< "$line")
  total=$(sed -nE 's/.* imported ([0-9.]+) MiB in this process.*/\1/p' <<< "$line")
  trials=$(sed -nE 's/.* ([0-9]+) memory-fit trials.*/\1/p' <<< "$line")
  summaries+=("llama.cpp pinned model=lavapipe planned_mib=${planned:-0} pinned_mib_total=${total:-0} fit_trials=${trials:-0}")
  awk -v p="${planned:-0}" -v t="${total:-0}" -v n="${trials:-0}" 'BEGIN { exit !(p > 0 && t <= p && n > 0) }' ||
    fail "a -fit load imported ${total:-?} MiB over ${trials:-?} trials for ${planned:-?} MiB planned; see $log.err"
}

# llama-bench fits and loads by itself (-fitt): with every import refused after its fit (the test
# build's hook) it fits and loads again, and measures, rather than failing or overcommitting.
check_bench_refit() { # MODEL
  local log=$out/run/bench-refit rc=0 pass=pass
  env LD_LIBRARY_PATH="$out/testing:$LD_LIBRARY_PATH" LLAMA_WEIGHTMAP_TEST_REFUSE_IMPORT=after-fit \
    "$out/testing/llama-bench" -m "$1" -fitt 1000 -p 0 -n 2 -r 1 -t 2 -o md > "$log.out" 2> "$log.err" < /dev/null || rc=$?
  [[ $rc == 0 ]] && grep -q 'fitting and loading again' "$log.err" && grep -qE '\| +tg2 +\|' "$log.out" || pass=fail
  echo "llama-bench, imports refused after its fit: exit $rc, $(grep -m1 'fitting and loading again' "$log.err" || echo 'no second fit')"
  check_line bench-fit-refused "$pass" "exit=$rc"
}

# The scheduler's split ordering: helper vs upstream on llama.cpp's graphs, traced and replayed,
# then the real-scheduler checks of split_sync_check.cpp.
# A ggml-rpc-server at HOST:PORT serving its CPU (a second device for llama.cpp), until stop_rpc_server.
start_rpc_server() { # HOST:PORT
  "$bin/ggml-rpc-server" -H "${1%:*}" -p "${1#*:}" -d CPU -t 1 >> "$out/logs/rpc-server.log" 2>&1 &
  rpc_pid=$!
  for _ in $(seq 100); do (: < "/dev/tcp/${1%:*}/${1#*:}") 2> /dev/null && break; sleep 0.1; done
  # ours must be the one listening: a stale server of an interrupted run would answer instead
  kill -0 "$rpc_pid" 2> /dev/null ||
    { echo "run.sh: ggml-rpc-server did not start on $1 (in use? see $out/logs/rpc-server.log)" >&2; exit 1; }
}
stop_rpc_server() { kill "$rpc_pid" 2> /dev/null || true; wait "$rpc_pid" 2> /dev/null || true; }

run_split_sync() { # MODELS_DIR
  local c name model rest rpc=127.0.0.1:${RPC_PORT:-50917}
  split_sync_upstream_max=0
  # a third backend: the CPU of a ggml-rpc-server on loopback, next to Vulkan and the local CPU
  start_rpc_server "$rpc"
  printf '\n%-22s %-9s %7s %7s %6s %6s %15s %15s\n' case rule graphs splits syncs drains replay_hazards replay_syncs
  for c in "dense-partial|$1/llama-dense.gguf|-ngl 1" "moe-experts-on-cpu|$1/llama-moe.gguf|-ot exps=CPU" \
           "qwen3moe-nkvo|$1/arch/qwen3moe-moe.gguf|-nkvo -ot exps=CPU" "gemma3-ngl2|$1/arch/gemma3-dense.gguf|-ngl 2" \
           "dense-rpc-3-backends|$1/llama-dense.gguf|--rpc $rpc -ts 1,1" "qwen35-nkvo|$1/arch/qwen35-dense.gguf|-ngl 99 -nkvo"; do
    IFS='|' read -r name model rest <<< "$c"
    split_sync_case "$name" "$model" "$rest"
  done
  stop_rpc_server
  # qwen35-nkvo: each layer's recurrent-state gather (GET_ROWS of the CPU's cache_r by the input
  # rs_s_copy, written back in place) is a CPU split without inputs after the Vulkan split that
  # read that state, so upstream's rule syncs once per graph
  ((split_sync_upstream_max > 0)) || fail "split-sync: no llama.cpp case where upstream's rule syncs"
  split_sync_ggml race
  split_sync_ggml deferred
  split_sync_ggml inplace
}

# sed: the number after " KEY=" in TEXT.
field() { sed -nE "s/.*[ ]$1=([0-9.]+).*/\1/p" <<< "$2" | head -n 1; }

# One llama.cpp case under both rules: LLAMA_WEIGHTMAP_SPLIT_SYNC_STATS counts every sync the helper
# caused, drains included; the helper may not sync more than the old rule.
split_sync_case() { # NAME MODEL FLAGS
  local name=$1 model=$2 replay_bin=$libwm_build/bench/bench_split_sync rule log stats replayed same
  local -a extra
  read -r -a extra <<< "$3"
  declare -A syncs=() hazards=() drains=() splits=() oracle=()
  for rule in helper upstream none; do
    log=$out/run/split-$name.$rule
    rm -f "$log.trace"
    if [[ $rule == none ]]; then # no rule (the test build's =none): what the oracle sees unguarded
      generate "$log" "$out/testing/llama-completion" "$model" LD_LIBRARY_PATH="$out/testing:$LD_LIBRARY_PATH" \
        LLAMA_WEIGHTMAP_SPLIT_SYNC=none LLAMA_WEIGHTMAP_SPLIT_SYNC_TRACE="$log.trace" -- -fit off "${extra[@]}"
      "$replay_bin" --oracle "$log.trace" > "$log.oracle" 2>&1 || true
      oracle[none]=$(field hazards "$(grep '^oracle ' "$log.oracle" || true)")
      continue
    fi
    generate "$log" "$bin/llama-completion" "$model" LLAMA_WEIGHTMAP_SPLIT_SYNC=$rule \
      LLAMA_WEIGHTMAP_SPLIT_SYNC_STATS=1 LLAMA_WEIGHTMAP_SPLIT_SYNC_TRACE="$log.trace" -- -fit off "${extra[@]}"
    stats=$(grep -m1 'split_sync: rule=' "$log.err" || true)
    "$replay_bin" --replay "$log.trace" > "$log.replay" 2>&1 || true
    replayed=$(grep "^replay rule=$rule " "$log.replay" || true)
    syncs[$rule]=$(field "syncs_$rule" "$stats")
    drains[$rule]=$(field drains "$stats")
    splits[$rule]=$(field splits "$stats")
    hazards[$rule]=$(field hazards "$replayed")
    # the oracle: from the bytes each split touched and the waits made, not the helper's model
    "$replay_bin" --oracle "$log.trace" > "$log.oracle" 2>&1 || true
    oracle[$rule]=$(field hazards "$(grep '^oracle ' "$log.oracle" || true)")
    printf '%-22s %-9s %7s %7s %6s %6s %15s %15s\n' "$name" "$rule" "$(field graphs "$stats")" \
      "${splits[$rule]:-?}" "${syncs[$rule]:-?}" "${drains[$rule]:-?}" "${hazards[$rule]:-?}" \
      "$(field syncs "$replayed")"
  done
  same=no
  same_tokens "$out/run/split-$name.helper" "$out/run/split-$name.upstream" && same=yes
  ((${syncs[upstream]:-0} > split_sync_upstream_max)) && split_sync_upstream_max=${syncs[upstream]}
  summaries+=("split_sync case=$name splits=${splits[helper]:-?} syncs_upstream=${syncs[upstream]:-?} syncs_helper=${syncs[helper]:-?} drains_helper=${drains[helper]:-?} tokens_identical=$same replay_hazards_upstream=${hazards[upstream]:-?} replay_hazards_helper=${hazards[helper]:-?} oracle_hazards_upstream=${oracle[upstream]:-?} oracle_hazards_helper=${oracle[helper]:-?} oracle_hazards_norule=${oracle[none]:-?}")
  # where upstream's rule syncs, the sync is needed: without any rule the oracle sees the hazard
  if ((${syncs[upstream]:-0} > 0)) && [[ ${oracle[none]:-0} == 0 ]]; then
    fail "split-sync $name: upstream's rule synced but the oracle sees no hazard without a rule"
  fi
  [[ ${oracle[helper]:-x} == 0 ]] || fail "split-sync $name: the oracle finds hazards under the helper ($(grep -m1 'first hazard' "$out/run/split-$name.helper.oracle" 2> /dev/null))"
  [[ $same == yes ]] || fail "split-sync $name: the rules generated different tokens"
  [[ ${hazards[helper]:-x} == 0 ]] || fail "split-sync $name: the helper's replay shows hazards"
  [[ -n ${syncs[helper]:-} && -n ${drains[helper]:-} && -n ${syncs[upstream]:-} ]] &&
    ((syncs[helper] + drains[helper] <= syncs[upstream])) ||
    fail "split-sync $name: the helper synced more than upstream (drains included)"
}

# split_sync_check.cpp on the real scheduler: CASE (race|deferred), SPLIT_SYNC_RUNS (default 1000)
# graphs per rule, rules alternating; each rule's trace replayed in the simulator.
split_sync_ggml() { # CASE
  local case=$1 runs=${SPLIT_SYNC_RUNS:-1000} exe=$out/split_sync_check log=$out/run/ggml-$1 rule r
  local replay_bin=$libwm_build/bench/bench_split_sync
  declare -A wrong=() us=() syncs=() hazards=() oracle=()
  if stale "$exe" "$here/split_sync_check.cpp"; then
    # llama-split-sync.cpp as the test build compiles it (its =none rule), with libllama's logger
    # shellcheck disable=SC2046
    g++ -std=c++17 -O2 -Wall -Wextra -Werror -DLLAMA_USE_WEIGHTMAP -DLLAMA_WEIGHTMAP_TESTING -I"$out/src/ggml/include" -I"$out/src/ggml/src" \
      -I"$out/src/include" -I"$out/src/src" $(pkg-config --cflags weightmap) "$here/split_sync_check.cpp" \
      "$out/src/src/llama-split-sync.cpp" -o "$exe" -L"$bin" -lllama -lggml -lggml-base -lggml-cpu -lggml-vulkan \
      $(pkg-config --libs weightmap) -Wl,-rpath,"$bin" ||
      { fail "split_sync_check.cpp does not build"; return; }
  fi
  rm -f "$log".*.trace
  LLAMA_WEIGHTMAP_SPLIT_SYNC_STATS=1 SPLIT_SYNC_CHECK_TRACE=$log LP_NUM_THREADS=1 \
    "$exe" "$case" "$runs" > "$log.out" 2> "$log.err" || { fail "split_sync_check $case failed; see $log.err"; return; }
  for rule in none upstream helper; do
    r=$(grep "^check case=$case rule=$rule " "$log.out" || true)
    wrong[$rule]=$(field wrong_runs "$r")
    us[$rule]=$(field us_per_graph "$r")
    # the scheduler's counters, one stats line per block: the rule's own syncs, summed
    syncs[$rule]=$(awk -v r="$rule" -v k="syncs_$rule" '$2 == "rule=" r {
        for (i = 1; i <= NF; i++) if (index($i, k "=") == 1) s += substr($i, length(k) + 2) } END { print s + 0 }' "$log.err")
    "$replay_bin" --replay "$log.$rule.trace" > "$log.$rule.replay" 2>&1 || true
    hazards[$rule]=$(field hazards "$(grep "^replay rule=$rule " "$log.$rule.replay" || true)")
    "$replay_bin" --oracle "$log.$rule.trace" > "$log.$rule.oracle" 2>&1 || true
    oracle[$rule]=$(field hazards "$(grep '^oracle ' "$log.$rule.oracle" || true)")
    printf 'split_sync_check %-8s %-9s runs=%s wrong_runs=%s us_per_graph=%s syncs=%s replay_hazards=%s oracle_hazards=%s\n' \
      "$case" "$rule" "$runs" "${wrong[$rule]:-?}" "${us[$rule]:-?}" "${syncs[$rule]:-?}" "${hazards[$rule]:-?}" "${oracle[$rule]:-?}"
  done
  summaries+=("split_sync ggml case=$case runs=$runs wrong_runs_norule=${wrong[none]:-?} wrong_runs_upstream=${wrong[upstream]:-?} wrong_runs_helper=${wrong[helper]:-?} syncs_upstream=${syncs[upstream]:-?} syncs_helper=${syncs[helper]:-?} us_per_graph_upstream=${us[upstream]:-?} us_per_graph_helper=${us[helper]:-?} replay_hazards_norule=${hazards[none]:-?} replay_hazards_upstream=${hazards[upstream]:-?} replay_hazards_helper=${hazards[helper]:-?} oracle_hazards_norule=${oracle[none]:-?} oracle_hazards_upstream=${oracle[upstream]:-?} oracle_hazards_helper=${oracle[helper]:-?}")
  [[ ${wrong[upstream]:-x} == 0 && ${wrong[helper]:-x} == 0 ]] || fail "split_sync_check $case: wrong outputs under a rule"
  [[ ${oracle[upstream]:-x} == 0 && ${oracle[helper]:-x} == 0 ]] || fail "split_sync_check $case: the oracle finds hazards under a rule"
  [[ ${hazards[upstream]:-x} == 0 && ${hazards[helper]:-x} == 0 ]] || fail "split_sync_check $case: the replay shows hazards under a rule"
  if [[ $case == inplace ]]; then
    # the shape the replay cannot see: only the outputs and the oracle show the race
    [[ ${wrong[none]:-0} != 0 && ${oracle[none]:-0} != 0 ]] ||
      fail "split_sync_check inplace: no race without a rule (wrong ${wrong[none]:-?}, oracle ${oracle[none]:-?})"
  elif [[ $case == race ]]; then
    [[ ${hazards[none]:-0} != 0 && ${oracle[none]:-0} != 0 ]] || fail "split_sync_check race: the replay or the oracle without a rule shows no hazard"
  else
    [[ -n ${syncs[helper]:-} && -n ${syncs[upstream]:-} ]] && ((syncs[helper] < syncs[upstream])) ||
      fail "split_sync_check deferred: the helper did not skip upstream's sync"
  fi
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
  generate "$log" "$out/testing/llama-completion" "$1" LD_LIBRARY_PATH="$out/testing:$LD_LIBRARY_PATH" \
    LLAMA_WEIGHTMAP_TEST_TENSOR_ALIGNMENT=256 --
  imported=$(wm_field imported "$log.err") device=$(wm_field device "$log.err")
  echo "tensor alignment 256: $(grep -m1 'weightmap: device' "$log.err" | sed 's/.*weightmap: //; s/; policy.*//')"
  awk -v a="$imported" -v d="$device" 'BEGIN { exit !(a > 0 && a < d) }' ||
    fail "tensors misaligned for the buffer type did not fall back alone (imported $imported of $device MiB)"
  same_tokens "$log" "$2" || fail "the tensor-alignment run generated other tokens"
}

# --- llama-server: one model in each arm, then three processes sharing it ---------------------
# Arms: import (the default), copy (LLAMA_WEIGHTMAP_IMPORT=0: upstream's loader with this
# device's AUTO load mode) and upstream (LLAMA_WEIGHTMAP_IMPORT=0 -lm none: upstream's default on
# an iGPU, #26081: no mmap, a read into the device buffer).
server_requests=('hello world' 'the quick brown fox')
server_arm() { # ARM: its env assignment and flags, one per line
  case $1 in
    import) echo LLAMA_WEIGHTMAP_IMPORT=1 ;;
    copy) echo LLAMA_WEIGHTMAP_IMPORT=0 ;;
    upstream) printf '%s\n' LLAMA_WEIGHTMAP_IMPORT=0 -lm none ;;
  esac
}

server_wrapper=() # a command start_server runs the server under (file_change_case: another user)
server_bin=""     # another llama-server than the release build's (the test build's: its hooks)
server_env=()     # more environment for it
# Starts llama-server on MODEL in ARM at 127.0.0.1:PORT with default flags and waits until
# /health answers; sets server_pid and server_load_s (from the start to a healthy answer: the
# load, the warm-up graph and the listening socket). -fa off: Mesa 22.3's lavapipe crashes
# (SIGSEGV in its own worker thread) on some of the server's flash-attention graphs (4 slots,
# one unified KV cache), in every arm, without libweightmap alike, after the warm-up or on a later
# request; llama-completion's graphs do not hit it.
start_server() { # LOG PORT ARM MODEL [FLAGS...]
  local log=$1 port=$2 model=$4 start end
  local -a arm
  mapfile -t arm < <(server_arm "$3")
  shift 4
  start=$(date +%s.%N)
  "${server_wrapper[@]}" env "${arm[0]}" "${server_env[@]}" "${server_bin:-$bin/llama-server}" -m "$model" --host 127.0.0.1 --port "$port" -t 2 -v -fa off "${arm[@]:1}" "$@" \
    > "$log.out" 2> "$log.err" < /dev/null &
  server_pid=$!
  for _ in $(seq 1200); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
    kill -0 "$server_pid" 2> /dev/null || break
    sleep 0.25
  done
  end=$(date +%s.%N)
  server_load_s=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
  curl -sf "http://127.0.0.1:$port/health" > /dev/null || { fail "$(basename "$log") did not come up; see $log.err"; return 1; }
}

# Greedy completion of request N (0 or 1) from the server at PORT: prints its token ids.
ask_server() { # PORT N
  local body
  body=$(printf '{"prompt": "%s", "n_predict": %d, "temperature": 0, "seed": 42, "return_tokens": true, "cache_prompt": false}' \
    "${server_requests[$2]}" "${SERVER_N_PREDICT:-4}")
  curl -sf -H 'Content-Type: application/json' -d "$body" "http://127.0.0.1:$1/completion" |
    grep -oE '"tokens": ?\[[0-9, ]*\]' | sed 's/^"tokens": *//; s/ //g' || echo "no answer"
}

# Stops the server PID with SIGTERM; a clean shutdown exits 0 and logs its cleanup.
stop_server() { # PID LOG
  local rc=0
  kill -TERM "$1" 2> /dev/null || true
  wait "$1" || rc=$?
  ((rc == 0)) && grep -q 'cleaning up before exit' "$2.err" ||
    fail "$(basename "$2") did not shut down cleanly (exit $rc); see $2.err"
}

# "RssAnon_KiB Pss_KiB majflt" of PID ("0 0 0" once it has exited)
memory_of() { # PID
  local status rollup stat
  status=$(cat "/proc/$1/status" 2> /dev/null) rollup=$(cat "/proc/$1/smaps_rollup" 2> /dev/null)
  stat=$(cat "/proc/$1/stat" 2> /dev/null)
  echo "$(awk '/^RssAnon:/ {print $2}' <<< "$status") $(awk '/^Pss:/ {print $2}' <<< "$rollup") $(awk '{print $12}' <<< "$stat")" |
    awk '{ printf "%d %d %d\n", $1, $2, $3 }'
}
# Seconds from the start of the process to the end of its weight load: the timestamp (m.ss.mmm.uuu)
# of the loader's weightmap line in LOG (logged when load_tensors is done, in every arm).
weights_loaded_s() { # LOG
  grep -m1 -E 'weightmap: (device|disabled)' "$1" | awk '{ split($1, t, "."); printf "%.2f\n", t[1] * 60 + t[2] + t[3] / 1e3 + t[4] / 1e6 }'
}
cached_mib() { fincore -b -n -o RES "$1" | awk '{ printf "%d", $1 / 1048576 }'; } # MODEL's page cache

# One arm on MODEL: server 1 answers both requests (its load time and memory are the one-server
# numbers); servers 2 and 3 start while it holds its weights and answer request 0; the three
# processes' memory is summed; then server 1 exits and 2 and 3 answer request 1, while the model's
# page cache and their major faults show whether anything was read again. Writes
# run/server.ARM.P.tokens (one line per request) and sets serve_one[ARM] ("load_s ready_s
# rss_anon_mib pss_mib" of server 1: weights loaded, /health answering) and serve_all[ARM] ("sum_rss_anon_mib sum_pss_mib cached_mib_before
# cached_mib_after majflt_after_exit").
serve_arm() { # ARM MODEL PORT [FLAGS...]
  local arm=$1 model=$2 port=$3 log=$out/run/server.$1 p pids=() rss=0 pss=0 a m faults=0 cached
  local mtime served=$SECONDS dirty=0
  shift 3
  rm -f "$log".*.tokens
  mtime=$(stat -c %.9Y "$model")
  for p in 1 2 3; do
    start_server "$log.$p" $((port + p - 1)) "$arm" "$model" "$@" || break
    pids[p]=$server_pid
    ask_server $((port + p - 1)) 0 > "$log.$p.tokens"
    if [[ $p == 1 ]]; then
      ask_server "$port" 1 >> "$log.1.tokens"
      read -r a m _ <<< "$(memory_of "$server_pid")"
      serve_one[$arm]="$(weights_loaded_s "$log.1.err") $server_load_s $((a / 1024)) $((m / 1024))"
    fi
  done
  if ((${#pids[@]} == 3)); then
    for p in 1 2 3; do read -r a m _ <<< "$(memory_of "${pids[p]}")"; rss=$((rss + a)) pss=$((pss + m)); done
    for p in 2 3; do faults=$((faults - $(memory_of "${pids[p]}" | cut -d' ' -f3))); done
    cached=$(cached_mib "$model")
    dirty=$(model_dirty_kib "${pids[1]}" "$model")
    stop_server "${pids[1]}" "$log.1"
    unset 'pids[1]'
    for p in 2 3; do ask_server $((port + p - 1)) 1 >> "$log.$p.tokens"; done
    for p in 2 3; do faults=$((faults + $(memory_of "${pids[p]}" | cut -d' ' -f3))); done
    serve_all[$arm]="$((rss / 1024)) $((pss / 1024)) $cached $(cached_mib "$model") $faults"
  fi
  for p in "${!pids[@]}"; do dirty=$((dirty + $(model_dirty_kib "${pids[p]}" "$model"))); done
  served=$((SECONDS - served))
  for p in "${!pids[@]}"; do stop_server "${pids[p]}" "$log.$p"; done
  [[ $arm == import ]] || return 0
  summaries+=("llama.cpp dirty case=server-import importer=vulkan shared_dirty_kib=$dirty mtime_unchanged=$(
    [[ $(stat -c %.9Y "$model") == "$mtime" ]] && echo yes || echo no) served_s=$served requests=$(cat "$log".*.tokens | wc -l)")
}

# KiB of the smaps FIELDS (an awk regex) over PID's mappings of FILE; 0 when PID is gone.
smaps_kib() { # PID FILE FIELDS
  awk -v f="$(realpath "$2")" -v fields="^($3):" '/^[0-9a-f]+-[0-9a-f]+ / { in_file = ($NF == f) }
    in_file && $1 ~ fields { kib += $2 } END { print kib + 0 }' "/proc/$1/smaps" 2> /dev/null || echo 0
}
# Dirty KiB (Shared_Dirty + Private_Dirty) of PID's mappings of FILE: what writeback would write
# to the model file, or a private copy of its pages. 0 for an importer that never writes them.
model_dirty_kib() { smaps_kib "$1" "$2" 'Shared_Dirty|Private_Dirty'; } # PID FILE
# The control: a process that writes one byte of each page of a writable shared mapping of a copy
# of FILE is seen dirty, and the copy's mtime moves.
check_dirty_control() { # FILE
  local copy=$out/run/dirty-control.gguf pid dirty mtime
  cp "$1" "$copy" && touch -d '2020-01-01' "$copy" && mtime=$(stat -c %.9Y "$copy")
  python3 -c 'import mmap, sys, time
f = open(sys.argv[1], "r+b"); m = mmap.mmap(f.fileno(), 0)
for i in range(0, len(m), mmap.PAGESIZE): m[i] = m[i]
print("written", flush=True); time.sleep(30)' "$copy" > "$copy.out" &
  pid=$!
  for _ in $(seq 100); do grep -q written "$copy.out" 2> /dev/null && break; sleep 0.1; done
  dirty=$(model_dirty_kib "$pid" "$copy")
  kill "$pid" 2> /dev/null; wait "$pid" 2> /dev/null || true
  summaries+=("llama.cpp dirty-control case=writable-writer shared_dirty_kib=$dirty mtime_unchanged=$(
    [[ $(stat -c %.9Y "$copy") == "$mtime" ]] && echo yes || echo no)")
  ((dirty > 0)) && [[ $(stat -c %.9Y "$copy") != "$mtime" ]] ||
    fail "the dirty check's control: a writer of a shared mapping was not seen (dirty $dirty KiB); the check could not fail"
  rm -f "$copy" "$copy.out"
}

# llama-server on MODEL in every arm: one server's load time and memory, three servers' sums, the
# two summary lines and their checks (identical tokens everywhere; importing saves >= 98 % of 3x
# the device bytes of RssAnon against each copying arm; the file-backed part of the import arm's
# Pss, summed, is at most one copy of the file; nothing re-read when a process exits).
run_servers() { # MODEL
  local model=$1 arm port=18080 device file_mib same=yes t ref=$out/run/server.import.1.tokens ngl ctx
  declare -gA serve_one=() serve_all=()
  serve_arm import "$model" "$port"
  # the copying arms at the import arm's layer count and context: -fit alone gives them fewer
  # layers on the device (imports cost it nothing), the rest mapped on the CPU, and other tokens;
  # -fit off alone, a quarter of the context (and of its KV cache) the import arm got
  ngl=$(layers "$out/run/server.import.1.err" 1)
  ctx=$(sed -nE 's/.*llama_context: n_ctx += ([0-9]+).*/\1/p' "$out/run/server.import.1.err" | tail -n 1)
  echo "llama-server: -fit gave the import arm ${ngl:-?}/$(layers "$out/run/server.import.1.err" 2) layers and a context of ${ctx:-?}; the copying arms run at -ngl ${ngl:-?} -c ${ctx:-?} -fit off"
  for arm in copy upstream; do
    port=$((port + 3))
    serve_arm "$arm" "$model" "$port" -ngl "${ngl:-99}" -c "${ctx:-0}" -fit off
  done
  device=$(wm_field device "$out/run/server.import.1.err")
  file_mib=$(($(stat -c %s "$model") / 1048576))
  printf '\n%-9s %7s %8s %13s %8s %14s %9s %13s %12s %16s\n' server load_s ready_s rss_anon_MiB pss_MiB \
    sum3_rss_anon sum3_pss cache_before cache_after majflt_after_exit
  for arm in import copy upstream; do
    read -r -a o <<< "${serve_one[$arm]:-? ? ? ?}"
    read -r -a s <<< "${serve_all[$arm]:-? ? ? ? ?}"
    printf '%-9s %7s %8s %13s %8s %14s %9s %13s %12s %16s\n' "$arm" "${o[@]}" "${s[@]}"
  done
  ! grep -qv '^\[[0-9,]\+\]$' "$ref" 2> /dev/null || same=no
  for t in "$out"/run/server.{import,copy,upstream}.{1,2,3}.tokens; do
    # server 1 answered requests 0 and 1; servers 2 and 3 request 0, and request 1 after 1 exited
    [[ -s $t ]] && cmp -s "$t" "$ref" || same=no
  done
  [[ $(wc -l < "$ref") == 2 ]] || same=no
  summaries+=("llama.cpp server case=$(basename "$(dirname "$model")")-$(basename "$model" .gguf) tokens_identical=$same load_s_import=$(cut -d' ' -f1 <<< "${serve_one[import]:-?}") load_s_copy=$(cut -d' ' -f1 <<< "${serve_one[copy]:-?}") load_s_upstream=$(cut -d' ' -f1 <<< "${serve_one[upstream]:-?}")")
  local -a i c u
  read -r -a i <<< "${serve_all[import]:-0 0 0 0 0}"
  read -r -a c <<< "${serve_all[copy]:-0 0 0 0 0}"
  read -r -a u <<< "${serve_all[upstream]:-0 0 0 0 0}"
  summaries+=("llama.cpp multiproc processes=3 device_mib=$device tokens_identical=$same sum_rss_anon_mib_import=${i[0]} sum_rss_anon_mib_copy=${c[0]} sum_rss_anon_mib_upstream=${u[0]} sum_pss_mib_import=${i[1]} sum_pss_mib_copy=${c[1]}")
  [[ $same == yes ]] || fail "llama-server: the arms or processes answered with different tokens"
  awk -v i="${i[0]}" -v c="${c[0]}" -v u="${u[0]}" -v d="$device" \
    'BEGIN { exit !(d > 0 && c - i >= 0.98 * 3 * d && u - i >= 0.98 * 3 * d) }' ||
    fail "three servers importing saved less than 98 % of 3 x $device MiB of RssAnon (import ${i[0]}, copy ${c[0]}, upstream ${u[0]} MiB)"
  awk -v p="${i[1]}" -v a="${i[0]}" -v f="$file_mib" 'BEGIN { exit !(p - a <= 1.05 * f) }' ||
    fail "three importing servers hold more than one copy of the file (sum Pss ${i[1]} MiB, RssAnon ${i[0]} MiB, file $file_mib MiB)"
  [[ ${i[4]} == 0 && ${i[3]} -ge ${i[2]} ]] ||
    fail "after one importing server exited the others re-read the model ($((i[4])) major faults, cache ${i[2]} -> ${i[3]} MiB)"
}

# --- CUDA and ROCm devices: the glue's importing half on the fake runtimes --------------------
# device_glue_check.cpp with src/llama-weightmap-device.cpp as libllama compiles it. Models: each
# of the pinned tree's 19 real tokenizer headers (models/ggml-vocab-*.gguf: their length decides
# where the data starts) with tensors of popular models' shapes appended (rows ggml-cuda pads:
# gpt-oss 2880 MXFP4 experts, Gemma-3 3840/5376, Llama-2 11008, Qwen3-30B-A3B 768, GLM 1408),
# planned and imported on the gb10 and orin fakes: one cuda-real-header line each. On the
# llama-bpe one: a cuda-glue line per fake device model (docs/cuda.md), an hsa-glue line per
# runtime behaviour (read-only locks accepted, refused: copied), and a dirty line for each. A
# poisoned copy (NaN after a padded tensor) must copy that tensor alone.
declare -A glue_method=([gb10]=direct [gh200]=unavailable [orin]=register [h200]=unavailable
                        [b300]=unavailable [nano]=unavailable)
build_device_glue_check() {
  local exe=$1
  if stale "$exe" "$here/device_glue_check.cpp" || [[ $out/src/src/llama-weightmap-device.cpp -nt $exe ]]; then
    # shellcheck disable=SC2046
    g++ -std=c++17 -O2 -Wall -Wextra -Werror -DLLAMA_USE_WEIGHTMAP -I"$out/src/ggml/include" -I"$out/src/ggml/src" \
      -I"$out/src/include" -I"$out/src/src" $(pkg-config --cflags weightmap) "$here/device_glue_check.cpp" \
      "$out/src/src/llama-weightmap-device.cpp" -o "$exe" -L"$bin" -lllama -lggml-base \
      $(pkg-config --libs weightmap) -Wl,-rpath,"$bin"
  fi
}
glue_run() { # NAME ENV... -- ARGS...: one run, its summary lines kept; the lines are echoed
  local name=$1 rc=0 lines; shift
  local envs=(); while [[ $1 != -- ]]; do envs+=("$1"); shift; done; shift
  lines=$(env "${envs[@]}" "$exe" "$@" 2> "$out/run/glue-$name.err") || rc=$?
  ((rc == 0)) || fail "device_glue_check $name: exit $rc; see $out/run/glue-$name.err"
  echo "$lines"
}
run_device_glue() {
  local exe=$out/device_glue_check dir=$out/models/real-headers line name vocab model cuda hsa refuse lines m
  build_device_glue_check "$exe" || { fail "device_glue_check.cpp does not build"; return; }
  cuda=$libwm_build/tests/cuda/libfake_cuda_driver.so hsa=$libwm_build/tests/hsa/libfake_hsa_runtime.so
  mkdir -p "$dir"
  for vocab in "$out"/src/models/ggml-vocab-*.gguf; do
    name=$(basename "$vocab") model=$dir/$name
    [[ -s $model ]] || "$exe" real-header "$vocab" "$model" || { fail "real-header $name failed"; continue; }
    for m in gb10 orin; do
      line=$(glue_run "$m-$name" WEIGHTMAP_FAKE_CUDA_MODEL=$m -- cuda "$m" "$model" "$cuda" "$name")
      summaries+=("${line:-llama.cpp cuda-real-header file=$name model=$m device_mib=0 imported_fraction=0}")
    done
  done
  model=$dir/ggml-vocab-llama-bpe.gguf
  for name in gb10 gh200 orin h200 b300 nano; do
    lines=$(glue_run "$name" WEIGHTMAP_FAKE_CUDA_MODEL=${name/nano/tegra-x1} -- cuda "$name" "$model" "$cuda")
    line=$(grep '^llama.cpp cuda-glue ' <<< "$lines")
    summaries+=("${line:-llama.cpp cuda-glue model=$name method=none imported_fraction=0 wrapped_buffers=0}")
    [[ $line == *" method=${glue_method[$name]} "* ]] || fail "cuda-glue $name: method is not ${glue_method[$name]}"
    line=$(grep '^llama.cpp dirty ' <<< "$lines") && summaries+=("$line")
    line=$(grep '^llama.cpp pinned ' <<< "$lines") && summaries+=("$line")
  done
  for name in read-only refused; do
    refuse=0
    [[ $name == refused ]] && refuse=1
    lines=$(glue_run "hsa-$name" WEIGHTMAP_FAKE_HSA_REFUSE_READ_ONLY=$refuse -- hsa "$name" "$model" "$hsa")
    line=$(grep '^llama.cpp hsa-glue ' <<< "$lines")
    summaries+=("${line:-llama.cpp hsa-glue case=$name imported_fraction=0 wrapped_buffers=0}")
    line=$(grep '^llama.cpp dirty ' <<< "$lines") && summaries+=("$line")
    line=$(grep '^llama.cpp pinned ' <<< "$lines") && summaries+=("$line")
  done
  # the pinned check can fail: trials that import, as before 0018, pin the plan once more each
  line=$(glue_run orin-trials-import DEVICE_GLUE_CHECK_TRIALS_IMPORT=1 WEIGHTMAP_FAKE_CUDA_MODEL=orin -- cuda orin "$model" "$cuda" |
    grep '^llama.cpp pinned ')
  summaries+=("${line/llama.cpp pinned /llama.cpp pinned-control }")
  awk -v l="$line" 'BEGIN { n = split(l, f, /[ =]/); for (i = 1; i < n; i++) v[f[i]] = f[i + 1]
    exit !(v["planned_mib"] > 0 && v["pinned_mib_total"] > v["planned_mib"]) }' ||
    fail "the pinned check's control (trials that import) pinned no more than planned: $line"
  run_hip_copy_check "$model" "$hsa"
  # the finite check can fail: NaN where a padded tensor's last row over-reads copies that tensor
  [[ -s $dir/poisoned.gguf ]] || "$exe" real-header "$out/src/models/ggml-vocab-llama-bpe.gguf" "$dir/poisoned.gguf" poison
  line=$(glue_run poisoned WEIGHTMAP_FAKE_CUDA_MODEL=gb10 -- cuda gb10 "$dir/poisoned.gguf" "$cuda" poisoned)
  grep -q "blk.0.ffn_down_exps.weight copied: the file's bytes after it, read as its padding, are not finite" \
    "$out/run/glue-poisoned.err" && awk -v l="$line" 'BEGIN { split(l, f, "imported_fraction="); exit !(f[2] > 0.5 && f[2] < 0.99) }' ||
    fail "the poisoned model's padded tensor was not copied alone: $line; see $out/run/glue-poisoned.err"
}

# hip_copy_check.cpp: the series' buffer-from-ptr.cu built for HIP against fake-hip/ (ROCclr's
# copy semantics), on an import of the fake HSA runtime: one hip-copy line per copy ggml-cuda
# makes out of a wrapped buffer, and upstream's copy of the agent address as a control that fails.
run_hip_copy_check() { # MODEL FAKE_HSA_LIBRARY
  local exe=$out/hip_copy_check src=$out/src/ggml/src/ggml-cuda/buffer-from-ptr.cu rc=0 line
  if stale "$exe" "$here/hip_copy_check.cpp" || stale "$exe" "$here/fake-hip/fake_hip_runtime.cpp" || [[ $src -nt $exe ]]; then
    # shellcheck disable=SC2046
    g++ -std=c++17 -O2 -Wall -Wextra -Werror -DGGML_USE_HIP -I"$here/fake-hip" -I"$out/src/ggml/src" \
      $(pkg-config --cflags weightmap) -x c++ "$src" -x none "$here/fake-hip/fake_hip_runtime.cpp" \
      "$here/hip_copy_check.cpp" -o "$exe" $(pkg-config --libs weightmap) ||
      { fail "hip_copy_check.cpp does not build"; return; }
  fi
  "$exe" "$1" "$2" > "$out/run/hip-copy.out" 2> "$out/run/hip-copy.err" || rc=$?
  while read -r line; do summaries+=("$line"); done < <(grep '^llama.cpp hip-copy ' "$out/run/hip-copy.out")
  ((rc == 0)) || fail "hip_copy_check: exit $rc; see $out/run/hip-copy.err"
}

# compile-check.sh: what the series adds to ggml-cuda, with Debian's nvcc 11.8 and hipcc 5.2.
run_compile_check() {
  local rc=0 line
  bash "$here/compile-check.sh" "$out/src" "$out/compile-check" > "$out/logs/compile-check.out" \
    2> "$out/logs/compile-check.err" || rc=$?
  while read -r line; do summaries+=("$line"); done < <(grep '^llama.cpp compile ' "$out/logs/compile-check.out")
  ((rc == 0)) || fail "compile-check.sh exited $rc; see $out/logs/compile-check.err"
  grep -q ' backend=cuda .* ok=yes' "$out/logs/compile-check.out" && grep -q ' backend=hip .* ok=yes' "$out/logs/compile-check.out" ||
    fail "compile-check.sh: a backend did not compile; see $out/logs/compile-check.err"
}

# --- a model file that changes under a running server (issues 37, 45) --------------------------
# ARM's server on a fresh copy of the dense model answers request 0; then CHANGE; then request 0
# again. CHANGE: touch (coreutils' opens the file for writing, which breaks a lease, then sets
# the times), close-no-write (an open for writing that writes nothing:
# with a lease it breaks it, so the imports move), overwrite (cp of another model over the file,
# as a re-download to the same path does), truncate (to 0 bytes); slow-move and move-fails are
# overwrites under the test build's hooks (the move's deadline 300 ms with 400 ms per chunk
# copied; the copies' allocation refused): the model must stop with an error naming the file,
# and the server stay up. LEASE=no runs the server as nobody, who does not own the file and so
# cannot take a lease (the guard watches the file instead). One summary line each; resident_*:
# RssAnon plus the resident pages of the process's mappings of the model file, before and after.
file_change_action() { # CHANGE MODEL LOG: sets tries
  tries=1
  case $1 in
    touch) touch "$2" ;;
    close-no-write) : >> "$2" ;;
    overwrite | slow-move | move-fails) timeout 120 cp "$out/models/mid/llama-dense.gguf" "$2" ;;
    truncate)
      until truncate -s 0 "$2" 2> "$3.truncate"; do
        ((tries < 100)) || break
        tries=$((tries + 1)); sleep 0.05
      done ;;
  esac
}
resident_mib() { # PID FILE
  local anon file_kib
  anon=$(awk '/^RssAnon:/ { print $2 }' "/proc/$1/status" 2> /dev/null)
  file_kib=$(smaps_kib "$1" "$2" Rss)
  echo $(((${anon:-0} + ${file_kib:-0}) / 1024))
}
file_change_case() { # ARM CHANGE LEASE PORT
  local arm=$1 change=$2 lease_wanted=$3 port=$4 dir=$out/run/file-change
  local log=$dir/$1.$2.$3 model=$dir/$1.$2.$3.gguf before after alive=yes answers lease=no start waited tries
  local resident_before resident_after want
  mkdir -p "$dir" && chmod 755 "$dir"
  cp "$out/models/llama-dense.gguf" "$model" && chmod 644 "$model"
  server_wrapper=() server_bin="" server_env=()
  [[ $lease_wanted == no ]] && server_wrapper=(setpriv --reuid=nobody --regid=nogroup --clear-groups --)
  case $change in
    slow-move) server_bin=$out/testing/llama-server
      server_env=(LD_LIBRARY_PATH="$out/testing:$LD_LIBRARY_PATH" LLAMA_WEIGHTMAP_TEST_MOVE_DEADLINE_MS=300 LLAMA_WEIGHTMAP_TEST_MOVE_SLOW_MS=400) ;;
    move-fails) server_bin=$out/testing/llama-server
      server_env=(LD_LIBRARY_PATH="$out/testing:$LD_LIBRARY_PATH" LLAMA_WEIGHTMAP_TEST_MOVE=fail-alloc) ;;
  esac
  start_server "$log" "$port" "$arm" "$model" || { server_wrapper=() server_bin="" server_env=(); return; }
  server_wrapper=() server_bin="" server_env=()
  before=$(ask_server "$port" 0)
  resident_before=$(resident_mib "$server_pid" "$model")
  start=$(date +%s.%N)
  # cp blocks in open(O_TRUNC) while a lease breaks; coreutils' truncate opens O_NONBLOCK, which
  # fails with EAGAIN instead (and starts the break): it is run again, as a user would, until it
  # truncates (tries= says how often)
  file_change_action "$change" "$model" "$log"
  waited=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
  sleep 0.3 # inotify's events after the fact: the guard hears them within a poll
  after=$(ask_server "$port" 0)
  resident_after=$(resident_mib "$server_pid" "$model")
  kill -0 "$server_pid" 2> /dev/null || alive=no
  if [[ $alive == no || $after == "no answer" ]]; then answers=error
  elif [[ $after == "$before" ]]; then answers=same
  else answers=changed; fi
  grep -q 'guarded by a read lease' "$log.err" && lease=yes
  if [[ $alive == yes ]]; then stop_server "$server_pid" "$log"; else wait "$server_pid" 2> /dev/null || true; fi
  summaries+=("llama.cpp file-change arm=$arm change=$change lease=$lease server_alive=$alive answers_after=$answers writer_wait_s=$waited writer_tries=$tries size_after=$(stat -c %s "$model") resident_before_mib=$resident_before resident_after_move_mib=$resident_after")
  [[ $arm == import ]] || return 0
  # what the import arm must answer: the loaded weights, or the error naming the file
  want=same
  case $change:$lease_wanted in
    slow-move:* | move-fails:* | overwrite:no | truncate:no) want=error ;;
  esac
  [[ $lease == "$lease_wanted" && $alive == yes && $answers == "$want" ]] ||
    fail "file-change import $change (lease wanted: $lease_wanted): lease=$lease alive=$alive answers_after=$answers, not $want; see $log.err"
  # the error names the file, and the move's failure is the one the case made
  local why="model file $model"
  case $change in
    slow-move) why="the deadline passed" ;;
    move-fails) why="no device memory for a copy" ;;
  esac
  if [[ $want == error ]] && ! { grep -q "model file $model" "$log.err" && grep -q "$why" "$log.err"; }; then
    fail "file-change import $change: the error does not name $model or say '$why'; see $log.err"
  fi
}

run_file_changes() {
  local arm change lease port=${FILE_CHANGE_PORT:-50960}
  for change in overwrite truncate; do
    for arm in import copy upstream; do
      file_change_case "$arm" "$change" yes "$port"; port=$((port + 1))
    done
  done
  for change in touch close-no-write overwrite truncate; do
    for lease in yes no; do
      [[ $change:$lease == overwrite:yes || $change:$lease == truncate:yes ]] && continue # above
      file_change_case import "$change" "$lease" "$port"; port=$((port + 1))
    done
  done
  for change in slow-move move-fails; do
    file_change_case import "$change" yes "$port"; port=$((port + 1))
  done
  fork_case
}

# fork: a pre-forked worker of an importing process (fork_check.cpp against this libllama). Its
# server is killed while the worker lives: the writer must not wait for the worker (before the
# guard's atfork handler it waited for the worker's exit); and a process that serves while a
# worker lives moves its imports and answers as before. The control forks with a raw clone(2),
# which runs no atfork handler: its writer must wait for the worker, or the check could not fail.
fork_case() {
  local exe=$out/fork_check dir=$out/run/file-change child_s=3 arm line lease
  if stale "$exe" "$here/fork_check.cpp"; then
    g++ -std=c++17 -O2 -Wall -Wextra -Werror -I"$out/src/include" -I"$out/src/ggml/include" "$here/fork_check.cpp" \
      -o "$exe" -L"$bin" -lllama -lggml -lggml-base -Wl,-rpath,"$bin" || { fail "fork_check.cpp does not build"; return; }
  fi
  mkdir -p "$dir"
  for arm in fork control; do
    cp "$out/models/llama-dense.gguf" "$dir/fork-$arm.gguf"
    line=$("$exe" "$dir/fork-$arm.gguf" "$out/models/arch/gemma3-dense.gguf" "$out/models/llama-dense.gguf" "$child_s" \
      "$([[ $arm == control ]] && echo control)" 2> "$dir/fork-$arm.err") || fail "fork_check $arm failed; see $dir/fork-$arm.err"
    lease=no
    grep -q 'guarded by a read lease' "$dir/fork-$arm.err" && lease=yes
    if [[ $arm == fork ]]; then
      summaries+=("llama.cpp file-change arm=import change=fork lease=$lease server_alive=yes $(sed 's/^fork child=fork //' <<< "$line") child_s=$child_s")
      awk -v w="$(field writer_wait_after_exit_s "$line")" -v c="$child_s" 'BEGIN { exit !(w != "" && w < c / 2) }' &&
        [[ $line == *" worker_alive_after_write=yes "* && $line == *" answers_after=same "* && $lease == yes ]] ||
        fail "file-change fork: $line (lease=$lease); see $dir/fork-$arm.err"
    else
      summaries+=("llama.cpp file-change-control change=fork $(sed 's/^fork //' <<< "$line") child_s=$child_s")
      awk -v w="$(field writer_wait_after_exit_s "$line")" -v c="$child_s" 'BEGIN { exit !(w != "" && w >= 0.8 * c) }' ||
        fail "file-change fork control: a worker made by clone(2) did not hold the writer: $line"
    fi
  done
}

# --- wm-doctor against the loads it predicts ----------------------------------------------------
# The installed wm-doctor (--engine llama.cpp, the default) on the glue's models and fakes, each
# answer compared with what device_glue_check's load did (its totals line: device and imported
# tensor bytes): every real header on gb10 and orin, and on the llama-bpe one each CUDA device
# model and both HSA behaviours. On lavapipe, llama-completion's own weightmap line on a dense, a
# quantized -ot and a --cpu-moe model. One wm-doctor line per device model and lavapipe case (the
# real headers only where they disagree). Controls that must disagree: the poisoned model (the
# glue reads the padding's bytes, which the doctor cannot: it says its import is the most), and
# the tensor alignment before 0016 (128, which most real headers miss).
doctor_glue_line() { # NAME MODEL DEVICE_LABEL ENV... -- GLUE_ARGS... : the line; false when it disagrees
  local name=$1 model=$2 label device=$3 totals load; shift 3
  label=$(basename "$model" | sed 's/^ggml-vocab-//')
  local envs=(); while [[ $1 != -- ]]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" "$out/device_glue_check" "$@" > /dev/null 2> "$out/run/doctor-glue-$name.err" || true
  totals=$(grep -m1 'device_glue_check: totals ' "$out/run/doctor-glue-$name.err") ||
    { echo "wm-doctor model=$label device=$device method=none import_mib=0 copy_mib=0 agrees_with_load=no"; return 1; }
  load="bytes:$(field device_bytes "$totals"):$(field imported_bytes "$totals")"
  env "${envs[@]}" "$doctor" --json "${doctor_args[@]}" "$model" > "$out/run/doctor-$name.json" 2> "$out/run/doctor-$name.err" ||
    true
  python3 "$root/scripts/doctor_line.py" "$out/run/doctor-$name.json" "$label" "$device" "$load"
}
run_doctor() {
  local dir=$out/models/real-headers cuda=$libwm_build/tests/cuda/libfake_cuda_driver.so
  local hsa=$libwm_build/tests/hsa/libfake_hsa_runtime.so doctor line m vocab name agree=0 total=0
  local -a doctor_args
  doctor=$(find "$dest" -path '*/bin/wm-doctor' | head -n 1)
  [[ -x $doctor ]] || { fail "wm-doctor is not installed under $dest"; return; }
  for vocab in "$dir"/ggml-vocab-*.gguf; do
    name=$(basename "$vocab" .gguf)
    for m in gb10 orin; do
      doctor_args=(--backend cuda) total=$((total + 1))
      if line=$(doctor_glue_line "$m-$name" "$vocab" "cuda-$m" WEIGHTMAP_CUDA_LIBRARY="$cuda" \
          WEIGHTMAP_FAKE_CUDA_MODEL=$m -- cuda "$m" "$vocab" "$cuda" "$name"); then
        agree=$((agree + 1))
      else
        summaries+=("$line"); fail "wm-doctor disagrees with the glue's load: $line"
      fi
    done
  done
  summaries+=("llama.cpp doctor real-headers=$((total / 2)) devices=2 agree=$agree total=$total")
  m=$dir/ggml-vocab-llama-bpe.gguf doctor_args=(--backend cuda)
  for name in gb10 orin gh200 h200; do
    line=$(doctor_glue_line "$name" "$m" "cuda-$name" WEIGHTMAP_CUDA_LIBRARY="$cuda" \
      WEIGHTMAP_FAKE_CUDA_MODEL=$name -- cuda "$name" "$m" "$cuda") || fail "wm-doctor disagrees with the glue's load: $line"
    summaries+=("$line")
  done
  doctor_args=(--backend hip)
  for name in read-only refused; do
    line=$(doctor_glue_line "hsa-$name" "$m" "hsa-$name" WEIGHTMAP_HSA_LIBRARY="$hsa" \
      WEIGHTMAP_FAKE_HSA_REFUSE_READ_ONLY=$([[ $name == refused ]] && echo 1 || echo 0) -- hsa "$name" "$m" "$hsa") ||
      fail "wm-doctor disagrees with the glue's load: $line"
    summaries+=("$line")
  done
  doctor_controls "$dir" "$cuda"
  doctor_lavapipe
}
# Each control's doctor must disagree with the load, or the comparison could not fail.
doctor_controls() { # DIR FAKE_CUDA
  local line
  doctor_args=(--backend cuda)
  line=$(doctor_glue_line poisoned "$1/poisoned.gguf" cuda-gb10 WEIGHTMAP_CUDA_LIBRARY="$2" WEIGHTMAP_FAKE_CUDA_MODEL=gb10 \
    -- cuda gb10 "$1/poisoned.gguf" "$2" poisoned) && fail "control: the doctor agreed on the poisoned model: $line"
  summaries+=("control: $line")
  doctor_args=(--backend cuda --tensor-alignment 128)
  line=$(doctor_glue_line align128 "$1/ggml-vocab-falcon.gguf" cuda-gb10 WEIGHTMAP_CUDA_LIBRARY="$2" WEIGHTMAP_FAKE_CUDA_MODEL=gb10 \
    -- cuda gb10 "$1/ggml-vocab-falcon.gguf" "$2" falcon) && fail "control: the doctor agreed at the old 128-byte alignment: $line"
  summaries+=("control: $line")
}
# lavapipe: llama-completion's weightmap line (device and imported MiB) against the doctor.
doctor_lavapipe() {
  local spec model flags label log load line
  for spec in "llama-dense.gguf|" "q4/llama-dense-q4_k_m.gguf|-ot blk\.1\.=CPU" "llama-moe.gguf|--cpu-moe"; do
    model=$out/models/${spec%%|*} label=$(basename "${spec%%|*}")
    read -r -a flags <<< "${spec#*|}"
    log=$out/run/doctor-lavapipe-$label.log
    "$bin/llama-completion" -m "$model" "${flags[@]}" -p hi -n 1 -no-cnv -t 2 -v > /dev/null 2> "$log" < /dev/null || true
    load=$(grep -m1 -oE 'weightmap: device [0-9.]+ MiB, imported [0-9.]+ MiB' "$log" | awk '{ print "mib:" $3 ":" $6 }')
    "$doctor" --backend vulkan --json "${flags[@]}" "$model" > "$log.json" 2> "$log.doctor.err" || true
    line=$(python3 "$root/scripts/doctor_line.py" "$log.json" "$label" vulkan "${load:-mib:0:0}") ||
      fail "wm-doctor disagrees with llama-completion's load ($label ${flags[*]}): $line; see $log"
    summaries+=("$line")
  done
}

# --- install.sh: the user's path --------------------------------------------------------------
# install.sh --backend vulkan into OUT/install (its own libweightmap build and llama.cpp tree; the
# compiler cache is run.sh's, and its tree sits beside its build as run.sh's does, so most objects
# are hits), then the README's commands: its llama-server with -lv 4 --log-file answers a request,
# the log's weightmap line says every device byte was imported, and its wm-doctor said so before.
# --backend cuda and hip with --check: as far as this machine goes (the toolkit found and
# configured), else exit 2 naming each missing prerequisite.
unset_wm_env=(env -u LD_LIBRARY_PATH -u PKG_CONFIG_PATH -u PKG_CONFIG_SYSROOT_DIR) # run.sh's own prefix
run_install() {
  local prefix=$out/install rc=0 line
  "${unset_wm_env[@]}" bash "$here/install.sh" --backend vulkan --prefix "$prefix" --jobs "${JOBS:-$(nproc)}" \
    > "$out/logs/install-vulkan.log" 2>&1 || rc=$?
  line=$(grep '^llama.cpp install ' "$out/logs/install-vulkan.log" | tail -n 1)
  summaries+=("${line:-llama.cpp install backend=vulkan ok=no seconds=0 binaries=0}")
  [[ $rc == 0 && $line == *" ok=yes "*" binaries=4" ]] ||
    { fail "install.sh --backend vulkan failed (exit $rc); see $out/logs/install-vulkan.log"; return; }
  install_serves "$prefix" "$out/models/q4/llama-dense-q4_k_m.gguf"
  for b in cuda hip; do install_check "$b"; done
}
install_serves() { # PREFIX MODEL
  local log=$out/run/install-server port=18391 answer load line
  rm -f "$log.log"
  server_wrapper=("${unset_wm_env[@]}") server_bin=$1/bin/llama-server
  start_server "$log" "$port" import "$2" -lv 4 --log-file "$log.log" || { server_wrapper=() server_bin=""; return; }
  answer=$(ask_server "$port" 0)
  stop_server "$server_pid" "$log"
  server_wrapper=() server_bin=""
  [[ $answer != "no answer" ]] || fail "the installed llama-server did not answer; see $log.err"
  load=$(grep -m1 -oE 'weightmap: device [0-9.]+ MiB, imported [0-9.]+ MiB' "$log.log" | awk '{ print "mib:" $3 ":" $6 }')
  local device imported
  IFS=: read -r _ device imported <<< "$load"
  [[ -n $load && $device == "$imported" ]] ||
    fail "the installed llama-server's log ($log.log) does not say every device byte was imported: ${load:-no weightmap line}"
  "${unset_wm_env[@]}" "$1/bin/wm-doctor" --backend vulkan --json "$2" > "$log.doctor.json" 2> "$log.doctor.err" || true
  line=$(python3 "$root/scripts/doctor_line.py" "$log.doctor.json" "$(basename "$2")" vulkan-installed "${load:-mib:0:0}") ||
    fail "the installed wm-doctor disagrees with the installed llama-server's load: $line"
  summaries+=("$line")
}
install_check() { # BACKEND
  local rc=0 line log=$out/logs/install-$1.log
  "${unset_wm_env[@]}" bash "$here/install.sh" --backend "$1" --prefix "$out/install-$1" --check > "$log" 2>&1 || rc=$?
  line=$(grep '^llama.cpp install ' "$log" | tail -n 1)
  summaries+=("${line:-llama.cpp install backend=$1 ok=no seconds=0 binaries=0}")
  if [[ $line == *" ok=yes "* ]]; then
    ((rc == 0)) || fail "install.sh --backend $1 --check said ok=yes but exited $rc; see $log"
  elif ((rc != 2)) || ! grep -q '^  - .*: ' "$log"; then
    fail "install.sh --backend $1 --check failed without naming a missing prerequisite (exit $rc); see $log"
  else
    echo "install.sh --backend $1 on this machine: $(grep '^  - ' "$log" | sed 's/^  - //; s/:.*//' | paste -sd ';')"
  fi
}
