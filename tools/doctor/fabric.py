"""libfabric: the providers `fi_info -l` lists (the efa transport needs the `efa` one on EFA hardware)."""

from __future__ import annotations

import shutil
import subprocess

from .report import FAIL, INFO, OK, Config, Finding, Host


def parse_provider_list(text: str) -> list[str]:
    """Provider names from `fi_info -l` output ("name:" lines, each followed by indented attributes)."""
    return [line[:-1] for line in text.splitlines() if line and not line[0].isspace() and line.endswith(":")]


def check(host: Host, cfg: Config) -> list[Finding]:
    wanted = cfg.protocol == "efa"
    tool = shutil.which("fi_info") if host.is_real else None
    if tool is None:
        detail = "fi_info not found (Debian: libfabric-bin); providers not listed"
        return [Finding("libfabric", "providers", INFO, detail + "; the efa plugin's probe below still applies"
                        if wanted else detail)]
    try:
        run = subprocess.run([tool, "-l"], capture_output=True, text=True, timeout=max(cfg.timeout, 5))
    except (OSError, subprocess.TimeoutExpired) as e:
        return [Finding("libfabric", "providers", INFO, f"fi_info -l did not answer: {e}")]
    providers = parse_provider_list(run.stdout)
    findings = [Finding("libfabric", "providers", INFO, ", ".join(providers) or "none",
                        data={"providers": providers})]
    if wanted:
        if "efa" in providers:
            findings.append(Finding("libfabric", "efa provider", OK, "listed"))
        else:
            findings.append(Finding("libfabric", "efa provider", FAIL, "not listed by fi_info -l",
                                    "install the AWS EFA installer's libfabric (or set FI_PROVIDER for a software "
                                    "provider in tests)"))
    return findings
