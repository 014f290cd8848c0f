#!/usr/bin/env python3
"""One `wm-doctor ... agrees_with_load=` line: wm-doctor's JSON for one device against what a load did.

Usage: doctor_line.py DOCTOR_JSON MODEL DEVICE LOAD
  DOCTOR_JSON  wm-doctor --backend X --json output (its first device is compared)
  MODEL        the model's name for the line
  DEVICE       the device's label for the line (cuda-gb10, vulkan, ...)
  LOAD         what the load reported, at its own resolution:
                 wm-load:FILE             wm-load --json's output (empty: it refused the importer)
                 bytes:DEVICE:IMPORTED    device and imported tensor bytes (device_glue_check's totals)
                 mib:DEVICE:IMPORTED      llama.cpp's "weightmap: device X MiB, imported Y MiB" (2 decimals)
                 refused                  the load refused the importer itself (a discrete card)
Prints
  wm-doctor model=<file> device=<name> method=<...> import_mib=<n> copy_mib=<n> agrees_with_load=<yes|no>
and exits 0 when the doctor agrees with the load, 1 when it does not.
"""
import json
import sys

MIB = 1048576.0


def agrees(d, load):
    kind, _, rest = load.partition(":")
    if kind == "wm-load":
        text = open(rest).read().strip()
        if not text:
            return agrees(d, "refused")
        r = json.loads(text)
        return (d["device_bytes"], d["import_bytes"]) == (r["device_bytes"], r["imported_bytes"])
    if kind == "refused":
        return not d["usable"] and d["import_bytes"] == 0
    device, value = rest.split(":")
    if kind == "bytes":
        return (d["device_bytes"], d["import_bytes"]) == (int(device), int(value))
    if kind == "mib":
        return (f"{d['device_bytes'] / MIB:.2f}", f"{d['import_bytes'] / MIB:.2f}") == (
            f"{float(device):.2f}", f"{float(value):.2f}")
    raise SystemExit(f"doctor_line.py: unknown LOAD kind '{kind}'")


def main():
    if len(sys.argv) != 5:
        raise SystemExit(__doc__)
    path, model, device, load = sys.argv[1:]
    d = json.load(open(path))["devices"][0]
    ok = agrees(d, load)
    print(f"wm-doctor model={model} device={device} method={d['method'].replace(' ', '-')} "
          f"import_mib={d['import_bytes'] / MIB:.2f} copy_mib={d['copy_bytes'] / MIB:.2f} "
          f"agrees_with_load={'yes' if ok else 'no'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
