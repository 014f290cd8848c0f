#!/usr/bin/env bash
# Sets everything up and runs every test: the README's test command, and what .ci/run calls.
#
# Stages (each fails the run on any failure or sanitizer report):
#   1. release build with -Werror, every test
#   2. consumers: the release build installed into a temporary prefix and used from outside the
#      tree (pkg-config C99, CMake C++17, Meson subproject, a build without Vulkan and HSA)
#   3. llama: llama.cpp (node-llama-cpp's bundle + integrations/llama.cpp/patches) built against
#      the installed release build, generating on lavapipe in both arms (integrations/llama.cpp)
#   4. AddressSanitizer + UndefinedBehaviorSanitizer (+ LeakSanitizer) build, every test
#   5. ThreadSanitizer build, the tests that run threads
#   6. every libFuzzer target for a bounded time (FUZZ_SECONDS, default 30 each)
# STAGES="release asan" limits the stages (default: all six).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh

stages=${STAGES:-release consumers llama asan tsan fuzz}
common=(--werror -Dvulkan=enabled -Dhsa=enabled -Dcuda=enabled)
passed=0
failed=0
summary=()

# Counts a meson test run's results from its JSON log into passed/failed.
count() {
  local log=$1/meson-logs/testlog.json
  local ok bad
  ok=$(grep -c '"result": "OK"' "$log" || true)
  bad=$(grep -cE '"result": "(FAIL|TIMEOUT|ERROR|UNEXPECTEDPASS)"' "$log" || true)
  passed=$((passed + ok))
  failed=$((failed + bad))
  summary+=("$2: $ok passed, $bad failed")
}

# Counts tests/consumers/run.sh's last line ("N passed, M failed") from its log; no such line
# (the script died) is one failure.
count_consumers() {
  local ok=0 bad=1 line
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$1" 2> /dev/null | tail -n 1 || true)
  if [[ -n $line ]]; then
    ok=${line%% passed*}
    bad=${line#*, }; bad=${bad%% failed}
  fi
  passed=$((passed + ok))
  failed=$((failed + bad))
  summary+=("$2: $ok passed, $bad failed")
}

# Counts integrations/llama.cpp/run.sh's summary lines: a weight case passes when its arms'
# tokens are identical, its own check (check=) did not fail, and the import arm imported >= 99 %
# of the device bytes (dense-big: with every layer on the device), or, for refused-all, peaked
# within 5 % of a pristine upstream build's RSS, or, for refused-real, no-mmap and dio, its check
# passed (the driver's refusal logged; the import stepped aside as upstream loads); a single check
# (kind=check) when it passed; a stock line when the series without options matched the pristine
# upstream build (tokens, load mode, buffer lines) with peak RSS within 1 %;
# a split-sync case when its tokens are identical under both rules, the helper's replay shows no
# hazard and it synced no more than upstream, drains included; a split-sync ggml case (the real
# scheduler, split_sync_check.cpp) when >= 1000 runs gave no wrong output under upstream's rule
# and the helper, their replays show no hazard, the race's replay without a rule does, and on the
# deferred shape the helper synced less than upstream, and the oracle (from the bytes each split
# touched and the waits made) finds no hazard under either rule but finds the race and the
# in-place shape's race without one (run.sh's exit status also covers the single
# checks: a refused import alone, --check-tensors, a corrupt model); a server line when every
# server answered with the same tokens; the multiproc line when three importing servers saved
# >= 98 % of 3x the device bytes of RssAnon against both copying arms; a speed line when the
# bench's arms generated the same tokens (its ratios are measurements, not pass marks: CI
# machines are shared); an install line for vulkan when it built all four binaries (cuda and hip:
# as far as the machine allows, run.sh checks that a refusal names what is missing); a wm-doctor
# line when the doctor agreed with the load, its controls when they did not, and the doctor line
# when every real header agreed; no line at all is one failure.
count_llama() {
  local ok bad
  read -r ok bad < <(awk '
    function num(key) { return match($0, " " key "=[0-9.]+") ? substr($0, RSTART + length(key) + 2, RLENGTH - length(key) - 2) + 0 : -1 }
    /^llama.cpp case=.* kind=check / { if (/ check=pass( |$)/) ok++; else bad++; next }
    /^llama.cpp case=/ {
      pass = / tokens_identical=yes( |$)/ && !/ check=fail( |$)/
      if (/ case=refused-all /)
        pass = pass && num("peak_rss_mib_import") > 0 && num("peak_rss_mib_import") <= 1.05 * num("peak_rss_mib_copy")
      else if (/ case=(refused-real|no-mmap|dio|fit-refused) /)
        pass = pass && / check=pass( |$)/
      else
        pass = pass && num("imported_fraction") >= 0.99
      if (/ case=dense-big /) pass = pass && num("layers_on_device_import") == num("n_layers")
      if (pass) ok++; else bad++
    }
    /^llama.cpp stock case=/ {
      d = num("peak_rss_mib_stock") - num("peak_rss_mib_upstream"); if (d < 0) d = -d
      if (/ tokens_identical=yes / && / same_load_mode=yes / && / same_buffers=yes / && num("peak_rss_mib_upstream") > 0 &&
          d <= 0.01 * num("peak_rss_mib_upstream")) ok++; else bad++
    }
    /^llama.cpp compile / { if (/ ok=yes( |$)/ && num("files") > 0) ok++; else bad++ }
    /^llama.cpp cuda-glue / {
      # the method each fake device model must get (docs/cuda.md); where it imports, >= 99 % in wrapped buffers
      want = / model=gb10 / ? "direct" : / model=orin / ? "register" : "unavailable"
      pass = index($0, " method=" want " ") > 0
      if (want != "unavailable") pass = pass && num("imported_fraction") >= 0.99 && num("wrapped_buffers") > 0
      if (pass) ok++; else bad++
    }
    /^llama.cpp hsa-glue / {
      # read-only locks import; a runtime that refuses them copies (a writable lock dirties the file)
      if (/ case=refused /) pass = num("imported_fraction") == 0 && num("wrapped_buffers") == 0
      else pass = num("imported_fraction") >= 0.99 && num("wrapped_buffers") > 0
      if (pass) ok++; else bad++
    }
    /^llama.cpp hip-copy / {
      # copies out of a wrapped ggml-hip buffer return the file; the upstream copy of the agent address does not
      if (/ case=upstream-/) pass = !/ result=ok /
      else if (/ case=(wrap-without-host|past-the-end) /) pass = / result=refused( |$)/
      else pass = / result=ok / && / bytes_equal=yes( |$)/
      if (pass) ok++; else bad++
    }
    /^llama.cpp cuda-real-header / { if (num("imported_fraction") >= 0.99 && num("device_mib") > 0) ok++; else bad++ }
    /^llama.cpp correctness / { if (/ pass=yes( |$)/ && num("kld_mean") >= 0 && num("kld_mean") <= 1e-6) ok++; else bad++ }
    /^llama.cpp pinned-control / { if (num("planned_mib") > 0 && num("pinned_mib_total") > num("planned_mib")) ok++; else bad++ }
    /^llama.cpp pinned / { if (num("planned_mib") > 0 && num("pinned_mib_total") <= num("planned_mib") && num("fit_trials") > 0) ok++; else bad++ }
    /^llama.cpp device-dry-run / { if (/ forced_zero_import=no exit=0( |$)/ || / forced_zero_import=yes exit=1( |$)/) ok++; else bad++ }
    /^llama.cpp dirty-control / { if (num("shared_dirty_kib") > 0 && / mtime_unchanged=no( |$)/) ok++; else bad++ }
    /^llama.cpp dirty / { if (num("shared_dirty_kib") == 0 && / mtime_unchanged=yes( |$)/) ok++; else bad++ }
    # the import arm is judged; copy and upstream are reported beside it (they do what upstream does)
    /^llama.cpp file-change arm=import / {
      # a move that cannot finish stops the model (the error); metadata never does; with a lease
      # the loaded weights stay; without one, never the changed bytes
      if (/ change=(slow-move|move-fails) /) pass = / server_alive=yes / && / answers_after=error( |$)/
      else if (/ change=fork /) pass = / server_alive=yes / && / answers_after=same( |$)/ && / worker_alive_after_write=yes / &&
        num("writer_wait_after_exit_s") >= 0 && num("writer_wait_after_exit_s") < num("child_s") / 2
      else if (/ change=(touch|close-no-write) / || / lease=yes /) pass = / server_alive=yes / && / answers_after=same( |$)/
      else pass = / server_alive=yes / && / answers_after=error( |$)/
      if (pass) ok++; else bad++
    }
    # install.sh: vulkan builds all four binaries here; cuda and hip go as far as this machine allows
    /^llama.cpp install / {
      if (/ backend=vulkan /) pass = / ok=yes / && num("binaries") == 4 && num("seconds") >= 0
      else pass = / ok=(yes|no) / && num("seconds") >= 0
      if (pass) ok++; else bad++
    }
    /^llama.cpp doctor / { if (num("agree") > 0 && num("agree") == num("total")) ok++; else bad++ }
    /^wm-doctor model=/ { if (/ agrees_with_load=yes( |$)/) ok++; else bad++ }
    /^control: wm-doctor model=/ { if (/ agrees_with_load=no( |$)/) ok++; else bad++ }
    # the fork control: a worker made without the atfork handler holds the writer until it exits
    /^llama.cpp file-change-control change=fork / { if (num("child_s") > 0 && num("writer_wait_after_exit_s") >= 0.8 * num("child_s")) ok++; else bad++ }
    /^llama.cpp server case=/ { if (/ tokens_identical=yes( |$)/ && num("load_s_import") > 0) ok++; else bad++ }
    /^llama.cpp multiproc / {
      d = 3 * num("device_mib")
      if (/ tokens_identical=yes( |$)/ && d > 0 && num("sum_rss_anon_mib_copy") - num("sum_rss_anon_mib_import") >= 0.98 * d &&
          num("sum_rss_anon_mib_upstream") - num("sum_rss_anon_mib_import") >= 0.98 * d) ok++; else bad++
    }
    /^llama.cpp speed / { if (/ tokens_identical=yes( |$)/ && num("tg_ratio_vs_copy") > 0) ok++; else bad++ }
    /^split_sync case=/ {
      if (/ tokens_identical=yes( |$)/ && num("replay_hazards_helper") == 0 && num("oracle_hazards_helper") == 0 && num("syncs_helper") >= 0 &&
          num("drains_helper") >= 0 && num("syncs_helper") + num("drains_helper") <= num("syncs_upstream") &&
          (num("syncs_upstream") == 0 || num("oracle_hazards_norule") > 0)) ok++; else bad++
    }
    /^split_sync ggml case=/ {
      pass = num("runs") >= 1000 && num("wrong_runs_upstream") == 0 && num("wrong_runs_helper") == 0 &&
             num("replay_hazards_upstream") == 0 && num("replay_hazards_helper") == 0 &&
             num("oracle_hazards_upstream") == 0 && num("oracle_hazards_helper") == 0
      if (/ case=deferred /) pass = pass && num("syncs_helper") >= 0 && num("syncs_helper") < num("syncs_upstream")
      if (/ case=race /) pass = pass && num("replay_hazards_norule") > 0 && num("oracle_hazards_norule") > 0
      if (/ case=inplace /) pass = pass && num("wrong_runs_norule") > 0 && num("oracle_hazards_norule") > 0
      if (pass) ok++; else bad++
    } END { print ok + 0, bad + 0 }' "$1" 2> /dev/null || echo "0 0")
  ((ok + bad > 0)) || bad=1
  passed=$((passed + ok))
  failed=$((failed + bad))
  summary+=("$2: $ok passed, $bad failed")
}

run_stage() {
  local name=$1 dir=$2; shift 2
  local start=$SECONDS status=0
  echo "=== stage $name ==="
  "$@" || status=$?
  summary+=("$name: $((SECONDS - start)) s, exit $status")
  return $status
}

overall=0
for stage in $stages; do
  case $stage in
    release)
      run_stage release build-ci bash -c "bash scripts/build.sh build-ci ${common[*]} &&
        meson test -C build-ci --print-errorlogs" || overall=1
      count build-ci release ;;
    consumers)
      mkdir -p build-ci
      run_stage consumers build-ci bash -c "set -o pipefail
        bash tests/consumers/run.sh build-ci | tee build-ci/consumers.log" || overall=1
      count_consumers build-ci/consumers.log consumers ;;
    llama)
      # Needs the release build (stage release); its summary lines are the stage's results.
      mkdir -p build-ci
      run_stage llama build-llama bash -c "set -o pipefail
        bash integrations/llama.cpp/run.sh build-ci build-llama | tee build-ci/llama.log" || overall=1
      count_llama build-ci/llama.log llama ;;
    asan)
      # LeakSanitizer cannot attribute what Mesa's lavapipe leaks from its JIT-compiled code
      # (every frame is "<unknown module>", which no suppression can name), so the Vulkan suite
      # runs with leak detection off, and every other test runs with it on and without any
      # Vulkan driver (VK_ICD_FILENAMES points nowhere: the registry's Vulkan is unavailable).
      export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
      export LSAN_OPTIONS=suppressions=$root/tests/sanitizers/lsan.supp:print_suppressions=0
      asan=detect_leaks=1:abort_on_error=1:allow_user_segv_handler=1
      run_stage asan build-asan bash -c "bash scripts/build.sh build-asan ${common[*]} \
          -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug" || overall=1
      run_stage asan-no-vulkan build-asan env ASAN_OPTIONS=$asan VK_ICD_FILENAMES=/nonexistent.json \
        meson test -C build-asan --no-rebuild --print-errorlogs --timeout-multiplier 3 \
        --no-suite vulkan || overall=1
      count build-asan asan
      run_stage asan-vulkan build-asan env ASAN_OPTIONS=${asan/detect_leaks=1/detect_leaks=0} \
        meson test -C build-asan --no-rebuild --print-errorlogs --timeout-multiplier 3 \
        --suite vulkan || overall=1
      count build-asan asan-vulkan ;;
    tsan)
      export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
      # Only the threaded tests are built here: the rest already ran twice.
      run_stage tsan build-tsan bash -c "bash scripts/build.sh build-tsan ${common[*]} \
          -Db_sanitize=thread -Db_lundef=false -Dbuildtype=debug \
          tests/test_concurrency tests/test_memstat tests/test_split_sync tests/test_populate \
          tests/test_populate_old_kernel tests/test_file_guard tests/test_file_guard_changes tests/attack/attack_file_guard \
          tests/c_api/test_c_concurrent_reads \
          tests/cuda/test_cuda_importer tests/cuda/test_fake_cuda_driver \
          tests/cuda/libfake_cuda_driver.so &&
        meson test -C build-tsan --no-rebuild --print-errorlogs --timeout-multiplier 3 --suite tsan" || overall=1
      count build-tsan tsan ;;
    fuzz)
      run_stage fuzz build-fuzz bash scripts/fuzz.sh "${FUZZ_SECONDS:-30}" || overall=1 ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done

echo "=== summary ==="
printf '%s\n' "${summary[@]}"
echo "$passed passed, $failed failed"
exit $overall
