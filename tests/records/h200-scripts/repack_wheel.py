"""Repack the installed (trimmed) vLLM 0.24.0 tree in /tmp/site as a wheel holding what vLLM's setup.py
extracts for VLLM_USE_PRECOMPILED (extension modules, vendored flash-attn/third_party Python, _version)."""
import sys
import zipfile
from pathlib import Path

site, out = Path(sys.argv[1]), Path(sys.argv[2])
out.parent.mkdir(parents=True, exist_ok=True)
count = 0
with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as wheel:
    for path in sorted(site.rglob("*")):
        rel = path.relative_to(site).as_posix()
        if not path.is_file():
            continue
        keep = rel.startswith("vllm-0.24.0.dist-info/") or (rel.startswith("vllm/") and (
            rel.endswith(".so") or rel.startswith(("vllm/vllm_flash_attn/", "vllm/third_party/"))
            or rel == "vllm/_version.py"))
        if keep:
            wheel.write(path, rel)
            count += 1
    if not (site / "vllm/vllm-rs").exists():  # the payload trimmed the Rust frontend; LLM() never runs it
        wheel.writestr("vllm/vllm-rs", "#!/bin/sh\necho 'vllm-rs: trimmed from the device payload' >&2\nexit 1\n")
print(f"{out}: {count} files, {out.stat().st_size >> 20} MiB")
